"""`python -m service.cli`: the `seedgrid` command."""

from service.cli import main

if __name__ == "__main__":
    main()
