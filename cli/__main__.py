import sys

from evolforge.cli import main

sys.exit(main())
