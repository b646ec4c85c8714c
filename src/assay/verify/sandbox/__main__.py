"""``python -m assay.verify.sandbox --launch SPEC -- CMD...``: the sandbox's launcher process."""

import sys

from assay.verify.sandbox.launcher import main

sys.exit(main())
