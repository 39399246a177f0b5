"""The headless subcommands of ``duplexcadence``: what each does, one line (``duplexcadence --help`` lists
them; the app's main module and its GUI entry both read this list)."""

#: what each subcommand does, one line (``duplexcadence --help`` lists them)
SUBCOMMAND_HELP = {
    "synth": "decode tokens with an engine decoder tail (no GUI)",
    "run": "headless duplex session over a WAV file (no GUI)",
    "serve": "host sessions on Ray Serve for remote clients (extra: serve)",
    "recover": "finish the journal a failed or killed `run` left (no GUI)",
}
