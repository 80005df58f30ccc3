import sys

from control_plane.cli.main import main

sys.exit(main())
