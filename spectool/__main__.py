from spectool.cli import main

main()
