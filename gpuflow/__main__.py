from gpuflow.cli.main import main

main()
