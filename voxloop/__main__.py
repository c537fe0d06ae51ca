import sys

from voxloop.cli import main

if __name__ == "__main__":  # not when a spawned front-end process imports it
    sys.exit(main())
