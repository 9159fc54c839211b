-- wrk script for bench/run.sh: one POST per request, with a per-status tally that wrk itself
-- does not keep (it counts only socket errors and statuses >= 400).
--
--   wrk ... -s bench/call.lua URL -- MODE PREFIX [RUN_ID] [STOP_AFTER] [PACE_MS]
--
-- MODE invoke: toolgate's envelope, POST /v1/invoke with a fresh tool_call_id per request
--              (PREFIX-THREAD-COUNTER, so no call of any leg is a duplicate); a response counts as
--              good when it is 200 and its body says "status":"READY".
-- MODE mcp:    the same call as an MCP client makes it: POST /mcp, a JSON-RPC tools/call with the
--              run and a fresh tool_call_id (as for invoke) in _meta, and the Accept and
--              MCP-Protocol-Version headers a client sends after its handshake; good when 200 and
--              the body says "isError":false (a JSON-RPC error or an isError result is not good).
-- MODE tool:   the tool's own input {"q":"x"}, for the direct and nginx paths; good when 200 and
--              the body carries "results".
-- STOP_AFTER:  when > 0, each thread stops after that many responses (with one connection per
--              thread: exactly that many calls).
-- PACE_MS:     when > 0, each connection waits that long between a response and its next
--              request (an offered load well below saturation; wrk's latency excludes the wait).
--
-- done() prints one line "BENCHJSON {...}" that bench/bench.py parses.

local threads = {}

function setup(thread)
   thread:set("tid", #threads + 1)
   table.insert(threads, thread)
end

local mode, prefix, run_id, stop_after, marker
local counter = 0
local responses = 0
statuses = {}
not_good = 0

function init(args)
   mode = args[1] or "tool"
   prefix = args[2] or "c"
   run_id = args[3] or ""
   stop_after = tonumber(args[4] or "0") or 0
   local pace = tonumber(args[5] or "0") or 0
   if pace > 0 then
      -- Defined only when pacing: wrk takes a timer per request once delay() exists.
      delay = function() return pace end
   end
   if mode == "invoke" then
      marker = '"status":"READY"'
   elseif mode == "mcp" then
      marker = '"isError":false'
      wrk.headers["Accept"] = "application/json, text/event-stream"
      wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
   else
      marker = '"results"'
   end
end

function request()
   counter = counter + 1
   local body
   if mode == "invoke" then
      body = '{"run_id":"' .. run_id .. '","tool_call_id":"' .. prefix .. "-" .. tid .. "-" ..
         counter .. '","tool":"bench","input":{"q":"x"}}'
   elseif mode == "mcp" then
      body = '{"jsonrpc":"2.0","id":' .. counter .. ',"method":"tools/call","params":' ..
         '{"name":"bench","arguments":{"q":"x"},"_meta":{"toolgate.dev/run_id":"' .. run_id ..
         '","toolgate.dev/tool_call_id":"' .. prefix .. "-" .. tid .. "-" .. counter .. '"}}}'
   else
      body = '{"q":"x"}'
   end
   return wrk.format("POST", nil, nil, body)
end

function response(status, headers, body)
   local key = tostring(status)
   statuses[key] = (statuses[key] or 0) + 1
   if status ~= 200 or body == nil or not string.find(body, marker, 1, true) then
      not_good = not_good + 1
   end
   responses = responses + 1
   if stop_after > 0 and responses >= stop_after then
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   local tally = {}
   local bad = 0
   for _, t in ipairs(threads) do
      local s = t:get("statuses") or {}
      for k, v in pairs(s) do
         tally[k] = (tally[k] or 0) + v
      end
      bad = bad + (t:get("not_good") or 0)
   end
   local parts = {}
   for k, v in pairs(tally) do
      table.insert(parts, string.format('"%s":%d', k, v))
   end
   local e = summary.errors
   io.write(string.format(
      'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"statuses":{%s},"not_good":%d,' ..
      '"latency_us":{"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      table.concat(parts, ","), bad,
      latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9)))
end
