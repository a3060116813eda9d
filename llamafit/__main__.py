"""``python -m llamafit``."""

from llamafit.cli.entry import main

if __name__ == "__main__":
    main()
