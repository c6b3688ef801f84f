import sys

from supervisor.front.main import main

sys.exit(main())
