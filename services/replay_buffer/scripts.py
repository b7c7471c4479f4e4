"""Lua scripts: every state transition of a group is one script, so it is atomic in Redis (and in its AOF, which
replays a script's effects as one MULTI/EXEC). A replay buffer SIGKILLed between two Redis commands can therefore
never leave a group counted twice or in two places. The rules mirror rules.py.

Scripts touch headers only. A scored group's bytes live in a string key of their own (`P:payload:GROUP_ID:NONCE`),
written with a plain SET (with an expiry) before the submit script runs, by the worker itself (or by the store, for
an inline submit), and read with a plain MGET by the trainer after the sample script names it: the scripts keep
(PERSIST), check the length of (STRLEN) or delete that key, never read it. The payload
keys share the `{prefix}` hash tag, so they sit in the same Redis Cluster slot as the keys the scripts declare.

Every script receives the same KEYS, in `Keys.all` order, bound to names by PRELUDE. Group states in the status hash:
enqueued | leased | scored | sampled:STEP | dead:REASON.
"""

PRELUDE = """
local K_PROMPTS, K_STATUS, K_TRAJ, K_READY, K_READY_VAL = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_TRAINED, K_DEAD, K_COUNTERS, K_AGE, K_RUN = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function entry(key, id)
  local e = redis.call('XRANGE', key, id, id)[1]
  if e then return fields(e[2]) end
  return nil
end

local function incr(name, by)
  if by ~= 0 then redis.call('HINCRBY', K_COUNTERS, name, by) end
end

-- A prompt's dead letter holds its bytes in `data`; a scored group's names its payload key in `pk` (kept).
local function dead_letter(gid, reason, kind, data, pk, detail, now)
  if pk ~= '' then redis.call('PERSIST', pk) end
  redis.call('XADD', K_DEAD, '*', 'gid', gid, 'reason', reason, 'kind', kind, 'detail', detail, 'at_ms', now,
             'data', data, 'pk', pk)
  redis.call('HSET', K_STATUS, gid, 'dead:' .. reason)
  incr('dead_lettered', 1)
  incr('dead:' .. reason, 1)
end

-- One command for many arguments (HSET, ZREM, XDEL, DEL take several) instead of one per group, in chunks that stay
-- under Lua's unpack limit (an even size, so HSET's field/value pairs stay whole). `key` nil: the list is all keys.
local function many(cmd, key, list)
  for i = 1, #list, 4000 do
    local j = math.min(i + 3999, #list)
    if key then redis.call(cmd, key, unpack(list, i, j)) else redis.call(cmd, unpack(list, i, j)) end
  end
end

local function run_int(name)
  return tonumber(redis.call('HGET', K_RUN, name) or '0')
end
"""

# ARGV: now_ms, then (group_id, target_step, validation 0|1, payload) per group.
ENQUEUE = """
local added, dup = 0, 0
for i = 2, #ARGV, 4 do
  if redis.call('HSETNX', K_STATUS, ARGV[i], 'enqueued') == 1 then
    redis.call('XADD', K_PROMPTS, '*', 'gid', ARGV[i], 'target', ARGV[i + 1], 'val', ARGV[i + 2], 'kind', 'prompt',
               'data', ARGV[i + 3])
    added = added + 1
  else
    dup = dup + 1
  end
end
incr('enqueued', added)
incr('duplicates', dup)
return {added, dup}
"""

# ARGV: group, consumer (worker id), pool consumer, max_groups, worker version, max_age, pool scan window.
# Returns {reason, {{entry_id, gid, kind, data, delivery_count}...}}.
LEASE = """
local group, consumer, pool = ARGV[1], ARGV[2], ARGV[3]
local n, bound = tonumber(ARGV[4]), tonumber(ARGV[5]) + tonumber(ARGV[6])
local base = math.max(run_int('floor'), run_int('step'))
local out, blocked = {}, false
local function eligible(f) return math.max(tonumber(f.target), base) <= bound end

-- Reclaimed and released groups first: they are the oldest work.
for _, p in ipairs(redis.call('XPENDING', K_PROMPTS, group, '-', '+', tonumber(ARGV[7]), pool)) do
  if #out >= n then break end
  local f = entry(K_PROMPTS, p[1])
  if f and eligible(f) then
    redis.call('XCLAIM', K_PROMPTS, group, consumer, 0, p[1])  -- counts one more delivery
    out[#out + 1] = {p[1], f.gid, f.kind, f.data, p[4] + 1}
  else
    blocked = true
  end
end

-- Then new entries. The trainer enqueues in target-step order, so only the eligible prefix of the undelivered
-- entries may be read: XREADGROUP cannot skip an entry.
if #out < n then
  local last = '0-0'
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', K_PROMPTS)) do
    local gf = fields(g)
    if gf['name'] == group then last = gf['last-delivered-id'] end
  end
  local k = 0
  for _, e in ipairs(redis.call('XRANGE', K_PROMPTS, '(' .. last, '+', 'COUNT', n - #out)) do
    if eligible(fields(e[2])) then k = k + 1 else blocked = true; break end
  end
  if k > 0 then
    local got = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', k, 'STREAMS', K_PROMPTS, '>')
    for _, e in ipairs(got[1][2]) do
      local f = fields(e[2])
      out[#out + 1] = {e[1], f.gid, f.kind, f.data, 1}
    end
  end
end
local status = {}
for _, o in ipairs(out) do
  status[#status + 1] = o[2]
  status[#status + 1] = 'leased'
end
many('HSET', K_STATUS, status)

incr('leased', #out)
local reason = ''
if #out == 0 then reason = blocked and 'age_bound' or 'queue_empty' end
return {reason, out}
"""

# ARGV: group, pool consumer, min_idle_ms, max_deliveries, now_ms, page size. Returns {reclaimed, dead_lettered}.
# XPENDING IDLE + XCLAIM with min-idle rather than XAUTOCLAIM: the same atomic claim, but it can skip entries that
# already sit in the pool (XAUTOCLAIM would re-claim those and count them again) and sees each entry's delivery count.
RECLAIM = """
local group, pool, idle, maxd = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local reclaimed, dead, start = 0, 0, '-'
local function reclaim(p)
  local f = entry(K_PROMPTS, p[1])
  if not f then
    redis.call('XACK', K_PROMPTS, group, p[1])  -- a pending id whose entry is gone: nothing left to lease
  elseif #redis.call('XCLAIM', K_PROMPTS, group, pool, idle, p[1], 'JUSTID') > 0 then
    if p[4] >= maxd then
      dead_letter(f.gid, 'max_deliveries', 'prompt', f.data, '', 'leased ' .. p[4] .. ' times, never submitted',
                  ARGV[5])
      redis.call('XACK', K_PROMPTS, group, p[1])
      redis.call('XDEL', K_PROMPTS, p[1])
      dead = dead + 1
    else
      redis.call('HSET', K_STATUS, f.gid, 'enqueued')
      reclaimed = reclaimed + 1
    end
  end
end
while true do
  local page = redis.call('XPENDING', K_PROMPTS, group, 'IDLE', idle, start, '+', tonumber(ARGV[6]))
  for _, p in ipairs(page) do
    if p[2] ~= pool then reclaim(p) end  -- pool entries were reclaimed already and wait for a worker
  end
  if #page < tonumber(ARGV[6]) then break end
  start = '(' .. page[#page][1]
end
incr('reclaimed', reclaimed)
return {reclaimed, dead}
"""

# ARGV: group, consumer (worker id), page size. Returns how many leases were renewed.
# XCLAIM to the same consumer with min-idle 0 resets an entry's idle time; JUSTID leaves its delivery count alone. So a
# lease lasts while its worker heartbeats, and `lease_timeout_ms` counts from the worker's last heartbeat: a group
# that takes long to grade (SWE-bench's 1800 s per task) is not leased again behind its live worker's back.
RENEW = """
local group, consumer, size = ARGV[1], ARGV[2], tonumber(ARGV[3])
local renewed, start = 0, '-'
while true do
  local page = redis.call('XPENDING', K_PROMPTS, group, start, '+', size, consumer)
  for _, p in ipairs(page) do
    redis.call('XCLAIM', K_PROMPTS, group, consumer, 0, p[1], 'JUSTID')
    renewed = renewed + 1
  end
  if #page < size then break end
  start = '(' .. page[#page][1]
end
return renewed
"""

# ARGV: group, pool consumer, entry_id, dead_letter 0|1, detail, now_ms, max_deliveries.
RELEASE = """
local p = redis.call('XPENDING', K_PROMPTS, ARGV[1], ARGV[3], ARGV[3], 1)[1]
local f = entry(K_PROMPTS, ARGV[3])
if not p or not f or p[2] == ARGV[2] then return 'not_found' end
local reason = nil
if ARGV[4] == '1' then reason = 'released' elseif p[4] >= tonumber(ARGV[7]) then reason = 'max_deliveries' end
if reason then
  dead_letter(f.gid, reason, 'prompt', f.data, '', ARGV[5], ARGV[6])
  redis.call('XACK', K_PROMPTS, ARGV[1], ARGV[3])
  redis.call('XDEL', K_PROMPTS, ARGV[3])
  return 'dead'
end
-- Not incrementing the delivery count: the next lease will.
redis.call('XCLAIM', K_PROMPTS, ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
redis.call('HSET', K_STATUS, f.gid, 'enqueued')
incr('released', 1)
return 'released'
"""

# ARGV: group, pool, max_age, now_ms, then per group: entry_id, lease_epoch, gid, target, min_version, max_version,
# validation 0|1, payload key, payload size. Returns {outcome, detail} per group, flat, in order; each group is
# judged by the same rules whatever else the call holds. The payload key is kept (stored or dead-lettered: its
# expiry cleared) or freed (duplicate, refused, re-queued): no outcome leaves it behind.
SUBMIT = """
local group, pool, max_age, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
-- The run's state is read once per call, not per group: nothing below changes it.
local run = fields(redis.call('HGETALL', K_RUN))
local epoch, step = tonumber(run.epoch or '0'), tonumber(run.step or '0')
local resume_version = tonumber(run.resume_version or '0')
-- What a stored group changes beyond its own traj entry goes in one command each per call (see the end); `seen`
-- and `acked` stand in for those writes within the call, so that a group or lease named twice in one batch is judged
-- exactly as if each submit were a call of its own.
local seen, acked, done_entries, status, ready, ready_val = {}, {}, {}, {}, {}, {}
-- A key with an expiry was never kept: free it. One without (PTTL -1) holds bytes that an earlier submit of this
-- very key kept (a retried call whose answer was lost): those are the group's, never deleted here. Keys are unique
-- per write (GROUP_ID:NONCE), so no other submit can name them.
local function free(pk)
  if redis.call('PTTL', pk) >= 0 then redis.call('DEL', pk) end
end
local function submit(entry_id, lease_epoch, gid, target, minv_s, maxv_s, val, pk, size)
  local function refuse(outcome, detail)
    free(pk)
    return {outcome, detail}
  end
  local f = nil
  if not acked[entry_id] then f = entry(K_PROMPTS, entry_id) end
  -- A live prompt entry of this very group means it is enqueued or leased (the accounting checks that); only
  -- otherwise is the status hash needed to tell an unknown group, a duplicate and a foreign lease apart.
  if not f or f.gid ~= gid then
    local st = seen[gid] or redis.call('HGET', K_STATUS, gid)
    if not st then return refuse('unknown_group', '') end
    if st ~= 'enqueued' and st ~= 'leased' then return refuse('duplicate', st) end
    if not f then return refuse('unknown_lease', '') end
    return refuse('mismatch', f.gid)
  end
  -- The bytes are the writer's; the script reads only their length (a group is never empty).
  local held = redis.call('STRLEN', pk)
  if held == 0 then return refuse('payload_missing', '') end
  if held ~= tonumber(size) then return refuse('payload_size', tostring(held)) end
  local minv, maxv = tonumber(minv_s), tonumber(maxv_s)
  -- A lease from an earlier run epoch may hold tokens of weights that the trainer's resume discarded (versions
  -- newer than the resumed ones): those tokens were never produced by this run, so the prompt is leased again.
  -- XCLAIM and XACK touch only an entry in the pending list: claiming or acknowledging nothing means the entry was
  -- never delivered (queued, not leased), and nothing has been written yet.
  if tonumber(lease_epoch) < epoch and maxv > resume_version then
    if #redis.call('XCLAIM', K_PROMPTS, group, pool, 0, entry_id, 'JUSTID') == 0 then
      return refuse('unknown_lease', '')
    end
    redis.call('HSET', K_STATUS, gid, 'enqueued')
    incr('requeued', 1)
    return refuse('requeued', '')
  end
  if redis.call('XACK', K_PROMPTS, group, entry_id) == 0 then return refuse('unknown_lease', '') end
  acked[entry_id] = true
  done_entries[#done_entries + 1] = entry_id
  if val ~= '1' and epoch > 0 and step - minv > max_age then
    dead_letter(gid, 'stale_on_submit', 'scored', '', pk, 'step ' .. step .. ', min_version ' .. minv, now)
    seen[gid] = 'dead:stale_on_submit'
    return {'dead', ''}
  end
  redis.call('PERSIST', pk)
  -- The prompt entry's kind and bytes (a few KB) stay with the header: a resume that re-queues the group needs them.
  local tid = redis.call('XADD', K_TRAJ, '*', 'gid', gid, 'target', target, 'minv', minv_s, 'maxv', maxv_s,
                         'val', val, 'pk', pk, 'size', size, 'pkind', f.kind, 'prompt', f.data)
  local index = ready
  if val == '1' then index = ready_val end
  index[#index + 1] = minv
  index[#index + 1] = tid
  status[#status + 1] = gid
  status[#status + 1] = 'scored'
  seen[gid] = 'scored'
  return {'ok', tid}
end
local out = {}
for i = 5, #ARGV, 9 do
  local r = submit(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6],
                   ARGV[i + 7], ARGV[i + 8])
  out[#out + 1] = r[1]
  out[#out + 1] = r[2]
end
many('XDEL', K_PROMPTS, done_entries)
many('ZADD', K_READY, ready)
many('ZADD', K_READY_VAL, ready_val)
many('HSET', K_STATUS, status)
incr('submitted', #status / 2)
return out
"""

# ARGV: step, max_groups, max_age, take_at_least, validation 0|1, now_ms, max_bytes, request_id.
# Returns {evicted, available, {payload key, gid, target, minv, maxv, val, size}...}: nothing is taken unless
# `take_at_least` groups are ready. A taken
# validation group's payload key gets an expiry (the store deletes it once read; the expiry covers a crash).
SAMPLE = """
local step, n, max_age, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local val, rid = ARGV[5] == '1', ARGV[8]
local function ref(f) return {f.pk, f.gid, f.target, f.minv, f.maxv, f.val, f.size} end
-- A retry of a call whose answer was lost in transit gets the same groups again, not more (exactly-once training).
if rid ~= '' and not val then
  local again = {0, 0}
  for _, e in ipairs(redis.call('XRANGE', K_TRAINED, '-', '+')) do
    local t = fields(e[2])
    if t.rid == rid and tonumber(t.step) == step then
      local f = entry(K_TRAJ, t.tid)
      if f then again[#again + 1] = ref(f) end
    end
  end
  if #again > 2 then
    again[2] = #again - 2
    return again
  end
end
local zkey = K_READY
local evicted = 0
if val then
  zkey = K_READY_VAL  -- validation groups are never trained, so they never age out
else
  if step > run_int('step') then redis.call('HSET', K_RUN, 'step', step) end
  for _, tid in ipairs(redis.call('ZRANGEBYSCORE', K_READY, '-inf', '(' .. (step - max_age))) do
    local f = entry(K_TRAJ, tid)
    redis.call('ZREM', K_READY, tid)
    if f then
      dead_letter(f.gid, 'too_old', 'scored', '', f.pk, 'step ' .. step .. ', min_version ' .. f.minv, ARGV[6])
      redis.call('XDEL', K_TRAJ, tid)
      evicted = evicted + 1
    end
  end
end
local available = redis.call('ZCARD', zkey)
local out = {evicted, available}
if available == 0 or available < need then return out end
local bytes, limit = 0, tonumber(ARGV[7])
-- Per group only what is the group's own (its trained entry, a validation payload's expiry); the index, status,
-- counter and age updates go in one command each for the whole answer.
local tids, status, ages = {}, {}, {}
local function take(tid, f)
  tids[#tids + 1] = tid
  status[#status + 1] = f.gid
  status[#status + 1] = 'sampled:' .. step
  if val then
    redis.call('PEXPIRE', f.pk, 600000)
  else
    -- Kept (by reference, with its payload key for CommitStep) until the trainer's checkpoint commits the step: a
    -- resumed trainer gets it back.
    redis.call('XADD', K_TRAINED, '*', 'gid', f.gid, 'step', step, 'tid', tid, 'rid', rid, 'pk', f.pk)
    local age = step - tonumber(f.minv)
    ages[age] = (ages[age] or 0) + 1
  end
  out[#out + 1] = ref(f)
end
-- Lowest min_version first (oldest weights first); ties in stream-id order, i.e. submission order.
for _, tid in ipairs(redis.call('ZRANGE', zkey, 0, n - 1)) do
  local f = entry(K_TRAJ, tid)
  if not f then
    redis.call('ZREM', zkey, tid)  -- a dangling index entry: never serve it (the accounting check reports it)
  elseif #out > 2 and bytes + tonumber(f.size) > limit then
    break
  else
    bytes = bytes + tonumber(f.size)
    take(tid, f)
  end
end
if #tids > 0 then
  many('ZREM', zkey, tids)
  many('HSET', K_STATUS, status)
  if val then many('XDEL', K_TRAJ, tids) end
end
for age, count in pairs(ages) do redis.call('HINCRBY', K_AGE, age, count) end
incr('sampled', #tids)
if val then incr('validated', #tids) end
return out
"""

# The run's lifecycle (BeginRun, CommitStep, PublishVersion) and the accounting check: scripts_run.py.
from services.replay_buffer.scripts_run import ACCOUNTING, BEGIN_RUN, COMMIT, PUBLISH  # noqa: E402

__all__ = ["PRELUDE", "ENQUEUE", "LEASE", "RECLAIM", "RENEW", "RELEASE", "SUBMIT", "SAMPLE", "BEGIN_RUN", "COMMIT",
           "PUBLISH", "ACCOUNTING"]
