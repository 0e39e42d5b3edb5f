"""`python -m attention_conformance`: the same as the `attention-conformance` command."""
import sys

from attention_conformance.cli import main

sys.exit(main())
