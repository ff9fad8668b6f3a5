"""``python -m atlantis.console``: the same as ``tide console``."""

from atlantis.console.command import console

if __name__ == "__main__":
    console(prog_name="atlantis-console")
