"""perencode: reproduce 'Positional Encoding Helps Recurrent Neural Networks Handle a Large
Vocabulary' (Morita, TMLR) from validated TOML recipes."""

__version__ = "0.1.0"
