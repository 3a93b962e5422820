"""`python -m raybatch`: the `raybatch` command, for where the script is not on PATH.

Run as `python -m raybatch`, not `-m raybatch.main`: the package imports `raybatch.main`
before runpy would run it as `__main__`, which runpy warns of.
"""

import sys

from raybatch.main import main

sys.exit(main())
