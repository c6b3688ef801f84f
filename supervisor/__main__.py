from supervisor.cli.commands import main

raise SystemExit(main())
