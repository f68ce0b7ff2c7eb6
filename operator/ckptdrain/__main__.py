from ckptdrain.cli import main

raise SystemExit(main())
