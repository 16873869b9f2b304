import sys

from evolm.cli import main

sys.exit(main())
