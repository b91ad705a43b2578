from grader.cli import main

if __name__ == "__main__":  # not when a fork server child imports it as __mp_main__
    raise SystemExit(main())
