"""The sweep that trains a grid's runs (`perencode sweep`).

Grid files and their cells are `perencode.config.grid`. Every cell runs in
`OUT/<grid file stem>/<axis>=<value>/...`, so the same grid always maps to the same
directories: finished runs are skipped, interrupted ones resume (`perencode train` does
both), and a cell whose exact recipe already has a run in another grid under OUT is linked
to that run instead of trained twice (a local sweep checks again as each cell starts:
`cells.claim_at_start`, for a sweep of an overlapping grid started beside it).

    run.py     run_sweep: plan, then run or print the plan (the command's work)
    cells.py   each cell's planned run: its state and the commands still to run (`plan`),
               the run directories claimed or linked (`prepare`)
    options.py what a sweep is asked to do (the command's options, declared once),
               and the interface of its executors
    local.py   the local executor (subprocesses, GPUs round-robin)
    slurm.py   the SLURM executor (a job array through submitit; submit and leave)
    validate.py the cells validated in a process started as the workers are (plugins)
    board.py   the live table
    estimates.py disk, FLOPs and device-hours of a grid (--dry-run, --estimate)

This package's own module imports nothing: `perencode --help` reads the sweep's options
(options.py) without loading the machinery (run.py) that needs torch and submitit.
"""
