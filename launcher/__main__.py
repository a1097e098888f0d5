from launcher.cli import main
from launcher.endings import exit_now

try:
    main()
except SystemExit as ended:  # the run has ended and said how (its exit status): no teardown of the interpreter
    exit_now(ended.code)
