"""``python -m website``: build the site (:func:`website.build.main`)."""

from website.build import main

raise SystemExit(main())
