import sys

from voxloop.cli import main

sys.exit(main())
