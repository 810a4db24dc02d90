from perencode.cli import app

app(prog_name="perencode")
