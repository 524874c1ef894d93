"""The hook's fast form, run by path (`python -S <this file> <harness> ...`): a script run by path
is compiled from source at every start, so this one is three lines and the hook itself
(supervisor.agents.hook) is imported, from its cached bytecode."""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from supervisor.agents.hook import main  # noqa: E402

sys.exit(main())
