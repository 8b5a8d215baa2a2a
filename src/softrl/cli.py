import typer

app = typer.Typer(no_args_is_help=True, help="softrl: RL post-training from any data (SPO, AGRO).")
