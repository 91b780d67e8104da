from mono_aot.cli import main

main()
