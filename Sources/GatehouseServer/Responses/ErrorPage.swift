import GatehouseCore

/// The page a browser shows when Gatehouse cannot send an error back to the app safely
/// (unknown app, unregistered redirect URI, unknown or used sign-in).
enum ErrorPage {
    static func html(for problem: GatehouseProblem) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(escape(problem.title)) · Gatehouse</title>
        <style>body{font-family:system-ui,sans-serif;max-width:34rem;margin:3rem auto;padding:0 1rem;line-height:1.5}
        code{background:#f3f3f3;padding:0 .25rem}</style></head>
        <body><h1>\(escape(problem.title))</h1>
        <p>\(escape(problem.detail))</p>
        <p>Close this window and start the sign-in again from the app.</p>
        <p><small>Error code: <code>\(escape(problem.code))</code></small></p>
        </body></html>
        """
    }

    static func escape(_ text: String) -> String {
        var output = ""
        for character in text {
            switch character {
            case "&": output += "&amp;"
            case "<": output += "&lt;"
            case ">": output += "&gt;"
            case "\"": output += "&quot;"
            case "'": output += "&#39;"
            default: output.append(character)
            }
        }
        return output
    }
}
