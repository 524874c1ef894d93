"""`python -m supervisor`: the `ccsup` command line (what `ccsup start` re-executes)."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="ccsup")
