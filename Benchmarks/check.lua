-- wrk script for Benchmarks/run: sends the target's request and checks the body of every
-- 1,000th response (the 1st, the 1,001st, … of each wrk thread) against the expected fixture,
-- so that a fast wrong answer cannot count. Configured through the environment (set per run by
-- Benchmarks/run):
--
--   BENCH_EXPECT_FILE   the body every checked response must have, byte for byte (required)
--   BENCH_CHECK_EVERY   check one response in this many (default 1000)
--   BENCH_METHOD        the request method (default GET)
--   BENCH_BODY_FILE     the request body (sent with Content-Length; default none)
--   BENCH_CONTENT_TYPE  the request body's Content-Type (default application/json)
--   BENCH_PROOFS_FILE   one DPoP proof per line (the dpop target): each request carries the next
--                       proof of its thread's share (BENCH_PROOF_THREADS threads; each proof once)
--
-- A checked response passes when its status is 200 and its body equals the fixture. At the end
-- it prints one line the harness parses:
--
--   body-check: checked=N failed=M responses=R every=1000
--
-- and, when a check failed, the first failure (status and the start of the body). No check at all
-- (checked=0) makes the run INVALID too. The counters are per-thread globals (each wrk thread has
-- its own Lua state); done() adds them up through thread:get, setup() keeps the thread list.

local threads = {}

function setup(thread)
   table.insert(threads, thread)
   thread:set("thread_index", #threads)
end

local function slurp(path)
   local f = assert(io.open(path, "rb"))
   local data = f:read("*a")
   f:close()
   return data
end

-- Per thread (globals, read by done() through thread:get).
responses, checked, failed, first_failure = 0, 0, 0, nil
local expected, every

function init(args)
   expected = slurp(assert(os.getenv("BENCH_EXPECT_FILE"), "BENCH_EXPECT_FILE is not set"))
   every = tonumber(os.getenv("BENCH_CHECK_EVERY") or "1000")
   local method = os.getenv("BENCH_METHOD")
   if method and method ~= "" then wrk.method = method end
   local body_file = os.getenv("BENCH_BODY_FILE")
   if body_file and body_file ~= "" then
      wrk.body = slurp(body_file)
      wrk.headers["Content-Type"] = os.getenv("BENCH_CONTENT_TYPE") or "application/json"
   end
   -- No request() function unless proofs are sent: wrk builds the request once (wrk.format) and sends it as is.
   if proofs then
      local share, stride, line_number = {}, tonumber(os.getenv("BENCH_PROOF_THREADS") or "1"), 0
      for line in io.lines(os.getenv("BENCH_PROOFS_FILE")) do
         if line_number % stride == (thread_index or 1) - 1 then share[#share + 1] = line end
         line_number = line_number + 1
      end
      proofs = share
      request_headers = {}
      for name, value in pairs(wrk.headers) do request_headers[name] = value end
   end
end

-- The dpop target: a fresh proof on every request (a proof used twice is refused, as it must be).
local proofs_file = os.getenv("BENCH_PROOFS_FILE")
if proofs_file and proofs_file ~= "" then
   proofs, used, request_headers = {}, 0, nil
   function request()
      used = used + 1
      request_headers["DPoP"] = proofs[used] or proofs[#proofs]
      return wrk.format(nil, nil, request_headers)
   end
end

function response(status, headers, body)
   responses = responses + 1
   if responses % every == 1 or every == 1 then
      checked = checked + 1
      if status ~= 200 or body ~= expected then
         failed = failed + 1
         if not first_failure then
            first_failure = string.format("status %d, %d bytes: %s", status, #body,
               (body:sub(1, 160):gsub("%c", " ")))
         end
      end
   end
end

function done(summary, latency, requests)
   local total_checked, total_failed, total_responses, first = 0, 0, 0, nil
   for _, thread in ipairs(threads) do
      total_checked = total_checked + (thread:get("checked") or 0)
      total_failed = total_failed + (thread:get("failed") or 0)
      total_responses = total_responses + (thread:get("responses") or 0)
      first = first or thread:get("first_failure")
   end
   io.write(string.format("body-check: checked=%d failed=%d responses=%d every=%s\n",
      total_checked, total_failed, total_responses, os.getenv("BENCH_CHECK_EVERY") or "1000"))
   if first then
      io.write("body-check first failure: " .. first .. "\n")
   end
end
