from launcher.cli import exit_now, main

try:
    main()
except SystemExit as ended:  # the run has ended and said how (its exit status): no teardown of the interpreter
    exit_now(ended.code)
