from gpuflow.cli.main import app

app(prog_name="gpuflow")
