from atlantis.keeper.main import main

raise SystemExit(main())
