from ovtrio.server.cli import main

main()
