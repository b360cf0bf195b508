from ovtrio.cli import main

main()
