import sys

from cuinfer.cli import main

sys.exit(main())
