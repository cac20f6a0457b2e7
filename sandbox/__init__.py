"""Local look-alikes of the identity providers Gatehouse talks to, built from their published
documentation, for Gatehouse's end-to-end tests and its demos (scripts/demo). Not for production.

    sandbox.franceconnect   FranceConnect (Particulier) v2 and v1
    sandbox.central         a broccoliapps-style central sign-in provider
    sandbox.check_*         each one's self-check, with no Gatehouse
    sandbox.doubleprocess   runs one as a process (run_double), read its ready line, stop it
    sandbox.secretsrecord   the secrets record they append to (GATEHOUSE_SECRETS_RECORD)

Each provider is also a script: `python sandbox/franceconnect.py --config cfg.json` (see its docstring).
"""
