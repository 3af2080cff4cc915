import sys

from rpc.eventer.cli import main

sys.exit(main())
