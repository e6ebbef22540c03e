"""zkl's tests, laid out as zkl/ is: tests/<package>/ holds the tests of zkl/<package>/, and
the tests here those of zkl's top-level modules and of the program as a whole.

Each test folder is a package, so one test module imports another as `tests.<package>.test_x`.
tests/helpers/ is no package: it is on sys.path (pyproject's `pythonpath`), as its modules are
imported by their own name (`task.reward=user_rewards:...`).
"""
