"""``python -m llamafit``."""

from llamafit.cli.app import main

if __name__ == "__main__":
    main()
