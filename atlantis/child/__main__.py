from atlantis.child.main import main

raise SystemExit(main())
