// The in-app sign-in client (see docs/in-app-sign-in.md).
