import sys

from smerge.cli.main import main

sys.exit(main())
