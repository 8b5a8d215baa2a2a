from softrl.cli import app

app(prog_name="softrl")
