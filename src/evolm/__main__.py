import sys

from evolm.commands import main

sys.exit(main())
