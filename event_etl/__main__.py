from event_etl.cli import main

main()
