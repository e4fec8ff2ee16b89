-- miltertest script: MTA-side conversations with a filter that obeys the
-- rules of the mail tests (crates/forkpool-cli/tests/common/milter_filters.rs):
-- adds X-Forkpool-Milter at end of message, rejects RCPT reject@... with
-- 550 5.7.1, tempfails MAIL tempfail@... with 451 4.7.1, quarantines a
-- message with a recipient hold@...
--
--   miltertest -D port=PORT [-D pid=PID] -s rules.lua
--
-- `pid`, if given, is the process the header must name. A step the filter
-- asked to skip (SMFIP_NO*) is not sent, and no reply is awaited for one it
-- asked not to answer (SMFIP_NR_*), as Postfix does. Any failed check
-- raises an error: miltertest then exits non-zero (printing nothing of its
-- own, so the check says what failed first).

local function check(ok, what)
  if not ok then
    mt.echo("check failed: " .. what)
    error("check failed: " .. what)
  end
end

-- One protocol step: `send` unless the filter negotiated `skip`; the
-- reply must be `want` (or, at end of message, accept) unless it
-- negotiated `noreply`.
local function step(conn, what, want, skip, noreply, send)
  if skip ~= nil and mt.test_option(conn, skip) then
    return
  end
  local err = send()
  check(err == nil, what .. " failed: " .. tostring(err))
  if noreply ~= nil and mt.test_option(conn, noreply) then
    return
  end
  local got = mt.getreply(conn)
  local eom_accept = string.sub(what, 1, 3) == "eom" and got == SMFIR_ACCEPT
  check(got == want or eom_accept,
    what .. ": reply " .. tostring(got) .. ", want " .. tostring(want))
end

-- The headers, end of headers and a body line of one message.
local function content(conn, subject, body)
  step(conn, "data", SMFIR_CONTINUE, SMFIP_NODATA, SMFIP_NR_DATA,
    function() return mt.data(conn) end)
  step(conn, "header From", SMFIR_CONTINUE, SMFIP_NOHDRS, SMFIP_NR_HDR,
    function() return mt.header(conn, "From", "<sender@forkpool.test>") end)
  step(conn, "header Subject", SMFIR_CONTINUE, SMFIP_NOHDRS, SMFIP_NR_HDR,
    function() return mt.header(conn, "Subject", subject) end)
  step(conn, "eoh", SMFIR_CONTINUE, SMFIP_NOEOH, SMFIP_NR_EOH,
    function() return mt.eoh(conn) end)
  step(conn, "body", SMFIR_CONTINUE, SMFIP_NOBODY, SMFIP_NR_BODY,
    function() return mt.bodystring(conn, body) end)
  step(conn, "eom", SMFIR_CONTINUE, nil, nil, function() return mt.eom(conn) end)
end

-- The pid X-Forkpool-Milter names, checked against `pid` if given.
local function handler(conn)
  check(mt.eom_check(conn, MT_HDRADD, "X-Forkpool-Milter"), "X-Forkpool-Milter added")
  local value = mt.getheader(conn, "X-Forkpool-Milter", 0)
  check(value ~= nil and string.match(value, "^%s*%d+%s*$") ~= nil,
    "X-Forkpool-Milter names a pid: " .. tostring(value))
  if pid ~= nil then
    check(tonumber(value) == tonumber(pid), "handled by " .. pid .. ", not " .. value)
  end
  return tonumber(value)
end

local conn = mt.connect("inet:" .. port .. "@127.0.0.1", 10, 0.1)
check(conn ~= nil, "connect to the filter on port " .. port)

-- Negotiation, offering what libmilter's headers define (all steps).
check(mt.negotiate(conn, nil, nil, nil) == nil, "negotiate")
check(mt.test_action(conn, SMFIF_ADDHDRS), "filter asks to add headers")
check(mt.test_action(conn, SMFIF_QUARANTINE), "filter asks to quarantine")

-- Macros as Postfix sends them, then the connection's stages.
mt.macro(conn, SMFIC_CONNECT, "j", "mt.forkpool.test", "{daemon_name}", "miltertest",
  "_", "client.forkpool.test [127.0.0.1]")
step(conn, "connect", SMFIR_CONTINUE, SMFIP_NOCONNECT, SMFIP_NR_CONN,
  function() return mt.conninfo(conn, "client.forkpool.test", "127.0.0.1") end)
mt.macro(conn, SMFIC_HELO, "{tls_version}", "")
step(conn, "helo", SMFIR_CONTINUE, SMFIP_NOHELO, SMFIP_NR_HELO,
  function() return mt.helo(conn, "client.forkpool.test") end)

-- A tempfailed sender: 451 4.7.1 comes back as a reply code.
mt.macro(conn, SMFIC_MAIL, "i", "TEMPFAIL1", "{mail_addr}", "tempfail@forkpool.test")
step(conn, "mail from tempfail@", SMFIR_REPLYCODE, nil, nil,
  function() return mt.mailfrom(conn, "<tempfail@forkpool.test>") end)
check(mt.abort(conn) == nil, "abort after the tempfailed sender")

-- A message with a rejected and an accepted recipient.
mt.macro(conn, SMFIC_MAIL, "i", "PLAIN1", "{mail_addr}", "sender@forkpool.test")
step(conn, "mail from", SMFIR_CONTINUE, nil, nil,
  function() return mt.mailfrom(conn, "<sender@forkpool.test>", "BODY=8BITMIME") end)
mt.macro(conn, SMFIC_RCPT, "{rcpt_addr}", "reject@example.org")
step(conn, "rcpt reject@", SMFIR_REPLYCODE, nil, nil,
  function() return mt.rcptto(conn, "<reject@example.org>") end)
mt.macro(conn, SMFIC_RCPT, "{rcpt_addr}", "ok@example.org")
step(conn, "rcpt ok@", SMFIR_CONTINUE, nil, nil,
  function() return mt.rcptto(conn, "<ok@example.org>") end)
content(conn, "plain-1", "A test message.\r\n")
local first = handler(conn)
check(not mt.eom_check(conn, MT_QUARANTINE), "a plain message is not quarantined")

-- A second message on the same connection, to hold@: quarantined.
mt.macro(conn, SMFIC_MAIL, "i", "HOLD1", "{mail_addr}", "sender@forkpool.test")
step(conn, "mail from (2nd message)", SMFIR_CONTINUE, nil, nil,
  function() return mt.mailfrom(conn, "<sender@forkpool.test>") end)
step(conn, "rcpt hold@", SMFIR_CONTINUE, nil, nil,
  function() return mt.rcptto(conn, "<hold@example.org>") end)
content(conn, "hold-1", "Hold me.\r\n")
check(mt.eom_check(conn, MT_QUARANTINE), "the message to hold@ is quarantined")
check(handler(conn) == first, "one conversation, one handling process")

check(mt.disconnect(conn) == nil, "quit")
mt.echo("handled-by " .. first)
