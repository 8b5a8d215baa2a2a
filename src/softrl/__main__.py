from softrl.command import main

main()
