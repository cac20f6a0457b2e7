"""Every process Gatehouse's end-to-end tests, demos (scripts/demo) and benchmark start: Gatehouse
itself and the upstreams it talks to (real servers, or look-alikes built from the providers'
published documentation). Not for production.

    sandbox.franceconnect   FranceConnect (Particulier) v2 and v1
    sandbox.central         a broccoliapps-style central sign-in provider
    sandbox.check_*         each one's self-check, with no Gatehouse
    sandbox.doubleprocess   runs one as a process (run_double), read its ready line, stop it
    sandbox.secretsrecord   the secrets record they append to (GATEHOUSE_SECRETS_RECORD)
    sandbox.gatehouse       Gatehouse as a process: write its config, start, wait until ready, log, stop
    sandbox.dot             django-oauth-toolkit, the real upstream (dot.run); sandbox.modern: the modern one
    sandbox.tokenproxy      the counting token proxy; sandbox.auth0mfa, sandbox.smtpsink: Auth0, SMTP
    sandbox.nativeapp, backends, stubserver, gatelog, dpop: the app, backends and log readers around it
    (sandbox/README.md: every module)

Each look-alike is also a program: `python -m sandbox.franceconnect --config cfg.json` (see its docstring).
"""
