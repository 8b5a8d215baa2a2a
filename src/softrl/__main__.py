from softrl.cli import entry

entry()
