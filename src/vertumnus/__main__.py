from vertumnus.cli import main

raise SystemExit(main())
