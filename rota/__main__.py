from rota.cli import run

run()
