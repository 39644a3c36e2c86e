import sys

from smerge.cli.main import console

sys.exit(console())
