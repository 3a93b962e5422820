"""`python -m batching.simulate ...`: the same as `raybatch simulate ...`."""

import sys

from batching.simulate.cli import main

sys.exit(main())
