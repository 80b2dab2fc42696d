-- wrk script of the write path (loadtests.storage.storagebench; core.wrk.WRK_POST_SCRIPT): every request is a
-- plone.restapi POST that creates a Document with an id of its own in the URL's folder, as the
-- user whose "Authorization" header value is in $PLONEDEPLOY_AUTH (from the environment, so the
-- password is on no command line). Ids: $PLONEDEPLOY_WRITE_PREFIX-<wrk thread>-<request number>;
-- the prefix must differ per wrk run (a second run with the same one would ask for taken ids).
-- Every answer other than 201 Created counts as a status error: the summary line of
-- wrk_summary.lua (loaded below, one copy of it) then carries that count in errors.status
-- instead of wrk's own (which counts only statuses >= 400).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "wrk_summary.lua")

local prefix = os.getenv("PLONEDEPLOY_WRITE_PREFIX") or "storagebench"
wrk.method = "POST"
wrk.headers["Accept"] = "application/json"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("PLONEDEPLOY_AUTH")

local threads = {}

function setup(thread)
  thread:set("thread_number", #threads + 1)
  table.insert(threads, thread)
end

-- Globals of each thread's own Lua state, read back by done() through thread:get.
counter = 0
not_201 = 0

function request()
  counter = counter + 1
  local body = string.format('{"@type": "Document", "id": "%s-%d-%d", "title": "storagebench %d"}',
    prefix, thread_number, counter, counter)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  if status ~= 201 then
    not_201 = not_201 + 1
  end
end

local summary_done = done

function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do
    total = total + thread:get("not_201")
  end
  summary.errors.status = total
  summary_done(summary, latency, requests)
end
