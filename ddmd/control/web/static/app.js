// ddmd live page: VM list, live thread states, stacks, heap figures, the heap bitmap and
// the selected VM's log (logcat).
//
// Same origin only: every request is a relative fetch to /api/v1 (or the EventSource on
// /api/v1/events when the daemon has one). Text that comes from VMs (names, frames) is put
// into the page with textContent, never as HTML. A token, when the daemon needs one, comes
// from a `ddmd_token` cookie (sent by the browser on its own) or from `#token=...` in the
// address / the banner form (sent as `Authorization: Bearer`, kept for this tab only).
"use strict";

(() => {
  const API = "/api/v1";
  const THREAD_INTERVAL_MS = 500; // 2 Hz while a VM's panel is shown
  const THREAD_SLOW_MS = 2000; // while the VM has not reported threads yet
  const VM_POLL_MS = 2000; // without an event stream
  const VM_SAFETY_MS = 15000; // with an event stream: a slow refresh in case one was missed
  const EVENTS_RETRY_MS = 30000; // try the event stream again after falling back to polling
  const HEAP_WIDTH = 512;
  const HEAP_HEIGHT = 512;
  const TOKEN_KEY = "ddmd.token";

  const REFRESH_DEBOUNCE_MS = 250;

  // Event names of the daemon's stream (SSE `event:` fields, ddmd.control.events.StreamEvent);
  // unnamed messages are handled too, by the `event` field of their JSON data.
  const STREAM_EVENTS = [
    "stream.opened", "vm.found", "vm.gone", "vm.changed", "vm.renamed",
    "vm.waiting_for_debugger", "debugger.attached", "debugger.detached", "current.changed",
    "threads.updated", "heap.info", "heap.dumped", "device.changed", "device.gone",
    "ext.updated", "app.crashed", "daemon.stopping", "overflow",
  ];

  const KNOWN_STATES = new Set([
    "running", "timed-wait", "monitor", "wait", "waiting", "sleeping", "init", "start",
    "native", "vmwait", "suspended", "zombie",
  ]);

  const $ = (id) => document.getElementById(id);

  const state = {
    token: "",
    vms: [],
    shown: null, // id of the VM whose panel is open
    threadGen: 0,
    threadTimer: null,
    stackThread: null,
    heapEtag: null,
    heapUrl: null,
    heapImages: [],
    heapOrigins: null, // GET .../heap: origins (which GC the figures and segments come from)
    legend: null,
    events: null,
    eventsOpen: false,
    pollTimer: null,
    safetyTimer: null,
    refreshQueued: false,
    refreshRunning: false,
    refreshAgain: false,
    gcRunning: false,
    shownGone: false,
    vmSignature: "",
    currentPort: null, // the current-VM port as the daemon bound it (GET /health)
  };

  class ApiError extends Error {
    constructor(status, message, body) {
      super(message);
      this.status = status;
      this.body = body;
    }
  }

  // ------------------------------------------------------------------------------ helpers

  function el(tag, opts = {}, ...children) {
    const node = document.createElement(tag);
    if (opts.cls) node.className = opts.cls;
    if (opts.text !== undefined && opts.text !== null) node.textContent = String(opts.text);
    if (opts.title) node.title = String(opts.title);
    if (opts.data) for (const [k, v] of Object.entries(opts.data)) node.dataset[k] = String(v);
    for (const child of children) if (child) node.appendChild(child);
    return node;
  }

  function setText(node, value) {
    const text = value === null || value === undefined ? "" : String(value);
    if (node.textContent !== text) node.textContent = text;
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  function note(node, text) {
    setText(node, text || "");
    show(node, Boolean(text));
  }

  function formatBytes(n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = n;
    let i = 0;
    while (value >= 1024 && i < units.length - 1) {
      value /= 1024;
      i += 1;
    }
    return i === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[i]}`;
  }

  function formatCount(n) {
    return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
  }

  function hex(n) {
    return "0x" + Number(n).toString(16).padStart(8, "0");
  }

  function clock(date) {
    return date.toLocaleTimeString("en-GB", { hour12: false });
  }

  // Which GC a heap table or segment summary comes from: the daemon's words (`origins` of
  // GET .../heap, control/origins.py), as `ddmd heap` prints them, with "N s ago" here.
  function originLines(origin, now) {
    if (!origin || typeof origin.why !== "string") return [];
    let when = "taken at a time ddmd does not know";
    if (typeof origin.at === "number") {
      const at = new Date(origin.at * 1000);
      const ago = Math.max(0, Math.round((now - at) / 1000));
      when = `taken at ${clock(at)} (${ago} s ago)`;
    }
    const lines = [`${when}, ${origin.why}`];
    if (typeof origin.note === "string") lines.push(`note: ${origin.note}`);
    return lines;
  }

  function renderOrigins() {
    const origins = state.heapOrigins || {};
    const now = new Date();
    for (const [id, origin] of [["heaps-origin", origins.heaps], ["images-origin", origins.images]]) {
      const lines = originLines(origin, now);
      const node = $(id);
      if (node.textContent !== lines.join(" · ")) node.textContent = lines.join(" · ");
      show(node, lines.length > 0);
    }
  }

  function vmPath(id) {
    // VM ids look like "tcp:8000" or "SERIAL/1234"; the API routes take the slash as is.
    return "/vms/" + id.split("/").map(encodeURIComponent).join("/");
  }

  function vmName(vm) {
    // The daemon's display name: package/app, a plain JVM's main class or "JVM pid N".
    return vm.name || vm.app || vm.package || vm.address || vm.id;
  }

  function vmLabel(vm) {
    // An older daemon without vm_label: its ident as it is.
    return vm.vm_label === undefined ? vm.vm_ident : vm.vm_label;
  }

  // ------------------------------------------------------------------------------ token

  function hashParams() {
    return new URLSearchParams(location.hash.replace(/^#/, ""));
  }

  function readToken() {
    // `/?token=...` logged this browser in (the daemon set its cookie): drop the token from
    // the address so it does not linger in history or screenshots.
    const query = new URLSearchParams(location.search);
    if (query.has("token")) {
      query.delete("token");
      history.replaceState(null, "", location.pathname +
        (query.toString() ? "?" + query.toString() : "") + location.hash);
    }
    const params = hashParams();
    try {
      if (params.has("token")) {
        sessionStorage.setItem(TOKEN_KEY, params.get("token"));
        params.delete("token");
        history.replaceState(null, "", location.pathname + location.search +
          (params.toString() ? "#" + params.toString() : ""));
      }
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (_) {
      return params.get("token") || "";
    }
  }

  function askForToken(message) {
    banner(message);
    show($("token-form"), true);
  }

  function banner(message) {
    note($("banner-text"), message);
    show($("banner"), Boolean(message));
    if (!message) show($("token-form"), false);
  }

  // ------------------------------------------------------------------------------ API

  async function api(path, { method = "GET", accept = "application/json", headers = {} } = {}) {
    const all = { Accept: accept, ...headers };
    if (state.token) all.Authorization = "Bearer " + state.token;
    let response;
    try {
      response = await fetch(API + path, {
        method, headers: all, credentials: "same-origin", cache: "no-store",
      });
    } catch (err) {
      setLive("offline", "ddmd unreachable");
      throw new ApiError(0, "ddmd does not answer at this address", null);
    }
    if (response.status === 401) {
      askForToken(state.token
        ? "The token was refused. Enter the daemon's [control] token:"
        : "This daemon requires a token ([control] token). Enter it:");
      throw new ApiError(401, "token required", null);
    }
    return response;
  }

  async function apiJson(path, opts) {
    const response = await api(path, opts);
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const message = body && typeof body.error === "string" ? body.error : response.statusText;
      throw new ApiError(response.status, message, body);
    }
    return body;
  }

  // ------------------------------------------------------------------------------ live mode

  function setLive(mode, text) {
    const node = $("live");
    node.dataset.mode = mode;
    setText(node, text);
  }

  function startEvents() {
    if (typeof EventSource === "undefined") {
      startPolling();
      return;
    }
    let source;
    try {
      source = new EventSource(API + "/events");
    } catch (_) {
      startPolling();
      return;
    }
    state.events = source;
    state.eventsOpen = false;
    source.onopen = () => {
      state.eventsOpen = true;
      stopPolling();
      setLive("events", "live · events");
      clearInterval(state.safetyTimer);
      state.safetyTimer = setInterval(queueRefresh, VM_SAFETY_MS);
      queueRefresh();
    };
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED || !state.eventsOpen) {
        // No stream here (404, not text/event-stream) or it failed for good: poll instead,
        // and try the stream again later.
        source.close();
        if (state.events === source) state.events = null;
        state.eventsOpen = false;
        clearInterval(state.safetyTimer);
        startPolling();
        setTimeout(() => {
          if (!state.events) startEvents();
        }, EVENTS_RETRY_MS);
      } else {
        startPolling(); // the browser reconnects by itself; poll meanwhile
      }
    };
    const handler = (event) => onStreamEvent(event);
    source.onmessage = handler;
    for (const name of STREAM_EVENTS) source.addEventListener(name, handler);
  }

  function onStreamEvent(event) {
    let name = event.type;
    let data = null;
    try {
      data = JSON.parse(event.data);
    } catch (_) {
      data = null;
    }
    if (name === "message" && data && typeof data === "object") {
      name = String(data.event || data.type || data.kind || "message");
    }
    if (name.startsWith("thread")) return; // the open panel polls threads itself
    if (name === "ext.updated") {
      const vm = data && typeof data === "object" ? data.vm : null;
      if (state.shown && vm === state.shown) renderExt(data.ext || {});
      return;
    }
    if (name === "app.crashed") {
      logcatCrashed(data && typeof data === "object" ? data : null);
      return;
    }
    if (name === "heap.info") {
      // New heap figures: GET .../heap again for the words of the GC they come from.
      const vm = data && typeof data === "object" ? data.vm : null;
      if (state.shown && vm === state.shown && !state.gcRunning) loadHeap(state.shown);
      queueRefresh();
      return;
    }
    if (name === "heap.dumped") {
      // A dump taken elsewhere (`ddmd heap --segments`) redraws the open panel's picture;
      // after our own "Cause GC" the ETag makes this a cheap 304.
      const vm = data && typeof data === "object" ? data.vm : null;
      if (state.shown && vm === state.shown && !state.gcRunning) loadHeap(state.shown);
      return;
    }
    queueRefresh();
  }

  function startPolling() {
    if (state.pollTimer) return;
    setLive("polling", `live · polling every ${VM_POLL_MS / 1000} s`);
    state.pollTimer = setInterval(queueRefresh, VM_POLL_MS);
    queueRefresh();
  }

  function stopPolling() {
    clearInterval(state.pollTimer);
    state.pollTimer = null;
  }

  // ------------------------------------------------------------------------------ VM list

  function queueRefresh() {
    if (state.refreshQueued) return;
    state.refreshQueued = true;
    setTimeout(() => {
      state.refreshQueued = false;
      refreshVms();
    }, REFRESH_DEBOUNCE_MS);
  }

  async function refreshVms() {
    if (state.refreshRunning) {
      state.refreshAgain = true;
      return;
    }
    state.refreshRunning = true;
    try {
      const vms = await apiJson("/vms");
      state.vms = Array.isArray(vms) ? vms : [];
      if (!state.eventsOpen && state.pollTimer) {
        setLive("polling", `live · polling every ${VM_POLL_MS / 1000} s`);
      } else if (state.eventsOpen) {
        setLive("events", "live · events");
      }
      if ($("banner").dataset.kind === "offline") {
        banner("");
        delete $("banner").dataset.kind;
      }
      renderVms();
      updateShownVm();
    } catch (err) {
      if (err.status === 0) {
        banner("ddmd does not answer at this address; retrying…");
        $("banner").dataset.kind = "offline";
      }
    } finally {
      state.refreshRunning = false;
      if (state.refreshAgain) {
        state.refreshAgain = false;
        queueRefresh();
      }
    }
  }

  function ddmCell(vm) {
    if (vm.ddm === true) {
      const missing = Object.entries(vm.missing || {}).filter(([f]) => f !== "DBGD");
      if (missing.length) {
        return el("span", {
          cls: "badge partial",
          text: "yes, limited",
          title: missing.map(([, sentence]) => sentence).join("\n"),
        });
      }
      return el("span", { cls: "badge yes", text: "yes" });
    }
    if (vm.ddm === false) return el("span", { cls: "badge no", text: "no", title: "plain JVM: JDWP only" });
    return el("span", { cls: "badge unknown", text: "…", title: "not known yet" });
  }

  // The VM table is rebuilt only when something it shows changed, so a button under the
  // pointer is not replaced between press and release.
  const VM_FIELDS = [
    "id", "app", "package", "vm_ident", "vm_label", "description", "pid", "device", "source", "address",
    "ddm", "unsupported", "name", "debugger_port", "debugger", "waiting_for_debugger", "state", "current",
    "foresight",
  ];

  function renderVms() {
    const vms = [...state.vms].sort((a, b) => vmName(a).localeCompare(vmName(b)) || a.id.localeCompare(b.id));
    const signature = JSON.stringify([state.shown, state.currentPort, vms.map((vm) => VM_FIELDS.map((f) => vm[f]))]);
    if (signature === state.vmSignature) return;
    state.vmSignature = signature;
    const tbody = $("vms").tBodies[0];
    const rows = document.createDocumentFragment();
    for (const vm of vms) {
      const tr = el("tr", { data: { vmId: vm.id } });
      if (vm.id === state.shown) tr.classList.add("shown");
      if (vm.current) tr.classList.add("current");

      const currentCell = el("td", { cls: "current-cell" });
      if (vm.kind && vm.kind !== "VM") {
        // A DDM client that is no VM (ddmd sysmon): nothing to debug, nothing to make current.
        currentCell.appendChild(el("span", { cls: "muted small", text: vm.kind }));
      } else if (vm.current) {
        currentCell.appendChild(el("span", { cls: "badge current", text: "● current" }));
      } else {
        const button = el("button", { cls: "small select", text: "Make current", title: "Debuggers on the current-VM port will reach this VM" });
        button.type = "button";
        button.addEventListener("click", (e) => {
          e.stopPropagation();
          selectVm(vm.id, button);
        });
        currentCell.appendChild(button);
      }
      tr.appendChild(currentCell);

      const nameCell = el("td", { cls: "name" });
      const open = el("button", { cls: "link", text: vmName(vm), title: vm.id });
      open.type = "button";
      open.addEventListener("click", (e) => {
        e.stopPropagation();
        openVm(vm.id);
      });
      nameCell.appendChild(open);
      if (vm.package && vm.package !== vm.app) {
        nameCell.appendChild(el("div", { cls: "muted small", text: vm.package }));
      }
      // The daemon's one label of the VM's kind ("ART", "OpenJDK 17.0.15"), as `ddmd clients`.
      const label = vmLabel(vm);
      if (label) nameCell.appendChild(el("div", { cls: "muted small vm-label", text: label }));
      if (vm.debugger_port !== null && vm.debugger_port !== undefined) {
        // Its own port: a debugger there always reaches this VM, current or not.
        nameCell.appendChild(el("div", {
          cls: "muted small mono attach-hint",
          text: `attach your debugger to localhost:${vm.debugger_port}`,
        }));
      }
      tr.appendChild(nameCell);

      tr.appendChild(el("td", { cls: "num", text: vm.pid ?? "—" }));
      tr.appendChild(el("td", { text: vm.device || "local" }));
      const source = el("td");
      source.appendChild(el("span", { text: vm.source }));
      source.appendChild(el("div", { cls: "muted small mono", text: vm.address }));
      tr.appendChild(source);
      tr.appendChild(el("td", {}, ddmCell(vm)));
      tr.appendChild(el("td", { cls: "num mono", text: vm.debugger_port ?? "—" }));
      const debuggerCell = el("td", { cls: vm.debugger ? "attached" : "muted", text: vm.debugger || "none" });
      const fs = vm.foresight;
      if (fs && fs.on) {
        // Foresight ([debugger] speculate): what ddmd answered itself instead of the VM.
        const answered = fs.answered_cache + fs.answered_speculation;
        const trip = fs.round_trip == null ? "" : `, round trip ${(fs.round_trip * 1000).toFixed(1)} ms`;
        debuggerCell.appendChild(el("div", {
          cls: "muted small foresight",
          text: `foresight: ${answered} answered locally${trip}`,
          title: `from kept replies ${fs.answered_cache}, from speculation ${fs.answered_speculation}; `
            + `asked ahead ${fs.speculated}, wasted ${fs.wasted}`,
        }));
      }
      tr.appendChild(debuggerCell);
      tr.appendChild(el("td", {}, vm.waiting_for_debugger
        ? el("span", { cls: "badge waiting", text: "waiting" })
        : el("span", { cls: "muted", text: "no" })));
      tr.appendChild(el("td", { text: vm.state }));
      const watch = el("td", { cls: "watch" });
      if (vm.id === state.shown) watch.appendChild(el("span", { cls: "badge watching", text: "shown" }));
      tr.appendChild(watch);

      tr.addEventListener("click", () => openVm(vm.id));
      rows.appendChild(tr);
    }
    tbody.replaceChildren(rows);
    show($("vms-empty"), vms.length === 0);
    show($("vms"), vms.length > 0);
    renderNoCurrent(vms.length > 0 && !vms.some((vm) => vm.current));
    setText($("vm-count"), vms.length === 1 ? "1 VM" : `${vms.length} VMs`);
  }

  // VMs, and none current: a debugger on the current-VM port would be turned away, so say so.
  function renderNoCurrent(visible) {
    let notice = $("no-current");
    if (!notice) {
      notice = el("p", { cls: "empty no-current" });
      notice.id = "no-current";
      $("vms").after(notice);
    }
    const where = state.currentPort !== null ? `port ${state.currentPort}` : "the current-VM port";
    notice.replaceChildren(
      document.createTextNode(`${where}: no current VM \u2014 `),
      el("code", { text: "ddmd select TARGET" }),
      document.createTextNode(" (or press Make current)"),
    );
    show(notice, visible);
  }

  async function selectVm(id, button) {
    button.disabled = true;
    state.vmSignature = ""; // redraw even if the refresh finds nothing new
    try {
      await apiJson(vmPath(id) + "/select", { method: "POST" });
    } catch (err) {
      banner(`Could not make ${id} current: ${err.message}`);
    }
    queueRefresh();
  }

  // ------------------------------------------------------------------------------ VM panel

  function shownVm() {
    return state.vms.find((vm) => vm.id === state.shown) || null;
  }

  function openVm(id) {
    if (state.shown === id) return;
    closeVm();
    state.shown = id;
    state.shownGone = false;
    const params = hashParams();
    params.set("vm", id);
    history.replaceState(null, "", "#" + params.toString());
    show($("detail"), true);
    showThreadTable(false);
    $("threads").tBodies[0].replaceChildren();
    setText($("threads-count"), "");
    setText($("threads-age"), "");
    note($("threads-note"), "Loading threads…");
    closeStack();
    state.heapEtag = null;
    state.heapImages = [];
    state.jvmHeap = null; // a plain JVM's GC.heap_info (GET .../heap: jvm_heap)
    state.jvmHeapWhy = null; // or why it cannot be had
    state.heapOrigins = null; // which GC the figures and the segments come from
    renderOrigins();
    show($("heap-view"), false);
    $("heaps").tBodies[0].replaceChildren();
    setText($("heap-status"), "");
    renderExt({});
    resetProfiling(); // updateShownVm then asks what the VM offers
    updateShownVm();
    renderVms();
    startThreads();
    loadHeap(id);
    loadExt(id);
    logcatOpenVm(id);
  }

  function closeVm() {
    stopThreads();
    logcatCloseVm();
    state.shown = null;
    show($("detail"), false);
    if (state.heapUrl) URL.revokeObjectURL(state.heapUrl);
    state.heapUrl = null;
    $("heap-img").removeAttribute("src");
    resetProfiling();
    delete $("heap-img").dataset.etag;
    const params = hashParams();
    if (params.has("vm")) {
      params.delete("vm");
      history.replaceState(null, "", location.pathname + location.search +
        (params.toString() ? "#" + params.toString() : ""));
    }
  }

  function threadsMissingReason(vm) {
    if (!vm) return "This VM is gone.";
    const missing = vm.missing || {};
    const why = missing.THST || missing.THEN;
    if (why) return why + ".";
    if (vm.ddm === null) return "Identifying this VM…";
    return null;
  }

  function heapMissingReason(vm) {
    if (!vm) return "This VM is gone.";
    const missing = vm.missing || {};
    if (vm.ddm === false) return state.jvmHeapWhy || null; // a plain JVM: GC.heap_info, or why not
    const why = missing.HPSG || missing.HPIF || missing.HPGC;
    if (why) return why + ".";
    if (vm.ddm === null) return "Identifying this VM…";
    return null;
  }

  function gcMissingReason(vm) {
    if (!vm) return "This VM is gone.";
    if (vm.ddm === false) return state.jvmHeapWhy || null; // GC.run: the attach API, as GC.heap_info
    const why = (vm.missing || {}).HPGC;
    return why ? why + "." : null;
  }

  function updateShownVm() {
    const id = state.shown;
    if (!id) return;
    const vm = shownVm();
    setText($("detail-title"), vm ? vmName(vm) : id);
    const sub = vm
      ? [vm.id, vm.pid !== null ? `pid ${vm.pid}` : null, vmLabel(vm), vm.abi].filter(Boolean).join(" · ")
      : id;
    setText($("detail-sub"), sub);
    note($("detail-note"), vm ? "" : "This VM is gone: ddmd lost its connection.");
    const debuggers = (vm && vm.debuggers) || [];
    const dbg = $("detail-debuggers");
    dbg.hidden = debuggers.length === 0;
    const viaWords = { current: "current-VM port", "vm-port": "its port", front: "the adb front",
      "front-forward": "an adb forward" };
    setText(dbg, debuggers.length === 0 ? "" : "Clients: " + debuggers.map((d) =>
      `${d.tool ? d.tool + " " : ""}${d.debugging === false ? "(DDM only) " : ""}` +
      `${d.peer} via ${viaWords[d.via] || d.via} ${d.port ?? ""}` +
      ` since ${d.since ? new Date(d.since * 1000).toLocaleTimeString() : "?"},` +
      ` ${d.packets_in} commands, ${d.suspensions} suspension${d.suspensions === 1 ? "" : "s"} held`
    ).join("; "));
    if (!vm && !state.shownGone) {
      state.shownGone = true;
      stopThreads();
      show($("threads-live"), false);
      profilingGone("This VM is gone.");
    } else if (vm && state.shownGone) {
      state.shownGone = false; // back (same id): watch it again
      startThreads();
      loadHeap(id);
      prof.ddm = undefined;
    }
    if (vm && vm.ddm !== prof.ddm) {
      // Opened, back, or just identified: what it offers may have changed.
      prof.ddm = vm.ddm;
      loadProfiling(id);
    }
    const heapReason = heapMissingReason(vm);
    const gc = $("gc");
    // Enabled wherever `ddmd gc` works: a VM without heap figures or segments may still
    // collect (HPGC); only a VM that cannot (or a JVM that cannot be attached) is refused.
    const gcReason = gcMissingReason(vm);
    gc.disabled = state.gcRunning || (Boolean(gcReason) && (!vm || vm.ddm !== null));
    gc.title = gcReason || (heapReason ? "Run a garbage collection" : "Run a garbage collection and fetch the heap segments");
    if (heapReason) {
      note($("heap-note"), heapReason);
    } else if (vm && vm.ddm === false) {
      note($("heap-note"), "Figures from the JVM's GC.heap_info (the HotSpot attach API); Cause GC runs GC.run.");
    } else if (!state.heapImages.length) {
      note($("heap-note"), "No heap dump yet. Cause GC runs a collection in the VM and draws the heap it reports.");
    }
    renderHeapInfo(vm);
    if (vm && lc.blocked === "name" && (vm.package || vm.app)) logcatRestart(); // named now
  }

  // ------------------------------------------------------------------------------ threads

  function startThreads() {
    stopThreads();
    if (!state.shown || document.hidden) return;
    const gen = state.threadGen;
    const id = state.shown;
    show($("threads-live"), true);
    const tick = async () => {
      if (gen !== state.threadGen) return;
      const began = performance.now();
      let delay = THREAD_INTERVAL_MS;
      try {
        let body = await apiJson(vmPath(id) + "/threads");
        if (body.threads == null && body.vm.ddm === false) body = await jvmThreads(id, body);
        if (gen !== state.threadGen) return;
        delay = renderThreads(body);
      } catch (err) {
        if (gen !== state.threadGen) return;
        if (err.status === 404 || err.status === 410) {
          note($("threads-note"), "This VM is gone.");
          showThreadTable(false);
          delay = 0;
        } else {
          note($("threads-note"), `Threads unavailable: ${err.message}`);
          delay = THREAD_SLOW_MS;
        }
      }
      if (gen !== state.threadGen) return;
      if (delay > 0) {
        state.threadTimer = setTimeout(tick, Math.max(0, delay - (performance.now() - began)));
      } else {
        show($("threads-live"), false);
      }
    };
    tick();
  }

  // A plain JVM before ddmd's own thread list came: its Java threads from its thread dump
  // (the HotSpot attach API; ids are jstack's #N), polled slowly (each dump is a safepoint in
  // the JVM); a JVM that cannot be attached says why (`why`).
  async function jvmThreads(id, body) {
    try {
      const dump = await apiJson(vmPath(id) + "/stacks");
      return { ...body, threads: dump.threads.filter((t) => t.id !== null), dump: true };
    } catch (err) {
      return { ...body, why: err.message };
    }
  }

  function stopThreads() {
    state.threadGen += 1;
    clearTimeout(state.threadTimer);
    state.threadTimer = null;
  }

  // Returns the delay before the next poll (0: stop).
  function renderThreads(body) {
    const vm = body.vm;
    const index = state.vms.findIndex((v) => v.id === vm.id);
    if (index >= 0) state.vms[index] = vm;
    const table = $("threads");
    if (body.threads === null || body.threads === undefined) {
      const reason = body.why ? sentence(body.why) : threadsMissingReason(vm);
      showThreadTable(false);
      setText($("threads-age"), "");
      setText($("threads-count"), "");
      note($("threads-note"), reason || "Waiting for the VM's first thread list…");
      if (reason && vm.ddm !== null) return 0; // it will not come: stop asking
      return THREAD_SLOW_MS;
    }
    note($("threads-note"), leftOut(body));
    showThreadTable(true);
    const tbody = table.tBodies[0];
    const existing = new Map();
    for (const row of tbody.rows) existing.set(row.dataset.threadId, row);
    const threads = [...body.threads].sort((a, b) => a.id - b.id);
    const seen = new Set();
    for (const t of threads) {
      const key = String(t.id);
      seen.add(key);
      let row = existing.get(key);
      if (!row) {
        row = el("tr", { data: { threadId: key } });
        for (const cls of ["num", "num", "tname", "state", "num", "num", "daemon"]) row.appendChild(el("td", { cls }));
        row.addEventListener("click", () => showStack(Number(row.dataset.threadId)));
        row.title = "Click for the stack trace";
      }
      const cells = row.cells;
      setText(cells[0], t.id);
      setText(cells[1], t.tid ?? "—");
      setText(cells[2], t.name || "(unnamed)");
      setState(cells[3], t.state ?? (t.status ?? "?"));
      setText(cells[4], t.utime ?? "—");
      setText(cells[5], t.stime ?? "—");
      setText(cells[6], t.daemon === null || t.daemon === undefined ? "—" : t.daemon ? "yes" : "");
      row.classList.toggle("selected", state.stackThread === t.id);
      tbody.appendChild(row); // keeps the id order; moves an existing row
    }
    for (const [key, row] of existing) if (!seen.has(key)) row.remove();
    setText($("threads-count"), `${threads.length}`);
    setText($("threads-age"), "updated " + clock(new Date()));
    // A plain JVM's list from its thread dump: each dump is a safepoint in the JVM.
    return body.dump || body.source === "Thread.print" ? THREAD_SLOW_MS : THREAD_INTERVAL_MS;
  }

  // What a plain JVM's thread list leaves out and why (the daemon's words; `ddmd threads`
  // prints the same line).
  function leftOut(body) {
    const out = body.left_out;
    if (!out) return "";
    const count = out.count === null || out.count === undefined ? "" : `${out.count} threads, `;
    const names = out.names && out.names.length ? `: ${out.names.join(", ")}` : "";
    return `Left out: ${count}${out.why}${names}.`;
  }

  function showThreadTable(visible) {
    show($("threads-scroll"), visible);
  }

  function setState(cell, value) {
    const text = String(value);
    let badge = cell.firstElementChild;
    if (!badge) {
      badge = el("span", { cls: "badge state" });
      cell.appendChild(badge);
    }
    if (badge.textContent === text) return;
    const known = KNOWN_STATES.has(text) ? text : "other";
    badge.className = `badge state st-${known}`;
    badge.textContent = text;
    cell.dataset.state = text;
    if (cell.dataset.seen) {
      cell.classList.remove("changed");
      void cell.offsetWidth; // restart the highlight animation
      cell.classList.add("changed");
    }
    cell.dataset.seen = "1";
  }

  // ------------------------------------------------------------------------------ stacks

  async function showStack(threadId) {
    const id = state.shown;
    if (!id) return;
    state.stackThread = threadId;
    for (const row of $("threads").tBodies[0].rows) {
      row.classList.toggle("selected", Number(row.dataset.threadId) === threadId);
    }
    const row = [...$("threads").tBodies[0].rows].find((r) => Number(r.dataset.threadId) === threadId);
    const name = row ? row.cells[2].textContent : "";
    show($("stack"), true);
    setText($("stack-title"), `Stack of thread ${threadId}${name ? " · " + name : ""}`);
    note($("stack-note"), "Loading…");
    $("stack-frames").replaceChildren();
    try {
      const body = await apiJson(`${vmPath(id)}/threads/${threadId}/stack`);
      if (state.shown !== id || state.stackThread !== threadId) return;
      const items = document.createDocumentFragment();
      for (const frame of body.frames) {
        const li = el("li");
        li.appendChild(el("span", { cls: "cls", text: frame.class_name }));
        li.appendChild(document.createTextNode("."));
        li.appendChild(el("span", { cls: "meth", text: frame.method_name }));
        let where;
        if (frame.line === -2) where = "native method";
        else if (frame.file_name && frame.line >= 0) where = `${frame.file_name}:${frame.line}`;
        else if (frame.file_name) where = frame.file_name;
        else where = "unknown source";
        li.appendChild(el("span", { cls: "src", text: ` (${where})` }));
        for (const lock of frame.locks || []) li.appendChild(el("div", { cls: "muted small", text: `- ${lock}` }));
        items.appendChild(li);
      }
      $("stack-frames").replaceChildren(items);
      if (body.java_state) {
        // A plain JVM's thread dump: its Java state, as jstack shows it.
        setText($("stack-title"), `Stack of thread ${threadId} · ${body.thread_name} · ${body.java_state}`);
      }
      note($("stack-note"), body.frames.length ? "" : "The VM reported an empty stack.");
    } catch (err) {
      if (state.shown !== id || state.stackThread !== threadId) return;
      const plain = (shownVm() || {}).ddm === false; // 501: why the JVM cannot be attached
      let text = `No stack: ${err.message}`;
      if (err.status === 501) {
        text = plain ? sentence(err.message)
          : "This VM does not report stack traces (Android 12+ removed the DDM handler).";
      }
      note($("stack-note"), text);
    }
  }

  function closeStack() {
    state.stackThread = null;
    show($("stack"), false);
    for (const row of $("threads").tBodies[0].rows) row.classList.remove("selected");
  }

  // ------------------------------------------------------------------------------ extensions

  async function loadExt(id) {
    try {
      const body = await apiJson(vmPath(id) + "/ext");
      if (state.shown === id) renderExt(body.ext || {});
    } catch (_) {
      /* an older daemon, or the VM is gone: no extension cards */
    }
  }

  // One card per chunk handler that published something: the system monitor's figures and
  // charts, or any other handler's value as key/value rows.
  function renderExt(ext) {
    const cards = document.createDocumentFragment();
    for (const name of Object.keys(ext).sort()) {
      const value = ext[name];
      const card = el("div", { cls: "ext-card", data: { handler: name } });
      card.appendChild(el("h4", { text: name }));
      if (value && typeof value === "object" && value.kind === "system monitor") {
        renderSysmon(card, value);
      } else {
        const list = el("dl", { cls: "figures" });
        const entries = value && typeof value === "object" && !Array.isArray(value)
          ? Object.entries(value) : [["value", value]];
        for (const [key, item] of entries) {
          list.appendChild(el("dt", { text: key }));
          list.appendChild(el("dd", {
            text: item !== null && typeof item === "object" ? JSON.stringify(item) : String(item),
          }));
        }
        card.appendChild(list);
      }
      cards.appendChild(card);
    }
    $("ext-cards").replaceChildren(cards);
    show($("ext-panel"), Object.keys(ext).length > 0);
  }

  function renderSysmon(card, value) {
    const latest = value.latest || {};
    const load = latest.load || [];
    const list = el("dl", { cls: "figures" });
    const used = latest.mem_used_share;
    const busy = (latest.cpu_busy || []).filter((b) => b !== null);
    const rows = [
      ["load 1/5/15 min", load.map((x) => x.toFixed(2)).join(" / ")],
      ["memory used", used === null || used === undefined ? "—" :
        `${(100 * used).toFixed(0)}% of ${formatBytes(1024 * (latest.mem_total_kib || 0))}`],
      ["CPUs busy", busy.length ? busy.map((b) => `${Math.round(100 * b)}%`).join(" ") : "—"],
    ];
    for (const [key, text] of rows) {
      list.appendChild(el("dt", { text: key }));
      list.appendChild(el("dd", { text }));
    }
    card.appendChild(list);
    const history = value.history || [];
    const maxLoad = Math.max(1, ...history.map((h) => h[1] || 0));
    card.appendChild(chart("load (1 min)", history, 1, maxLoad, "chart-load"));
    card.appendChild(chart("memory used", history, 2, 1, "chart-memory"));
  }

  // A small line chart of the last five minutes: x = time, y = point[index] / top.
  function chart(label, history, index, top, id) {
    // The SVG namespace, derived from the page's own (XHTML) one: the page names no other
    // origin, not even in a namespace string.
    const NS = document.documentElement.namespaceURI.replace("1999/xhtml", "2000/svg");
    const width = 240;
    const height = 48;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `${label}, last 5 minutes`);
    svg.dataset.chart = id;
    const points = history.filter((h) => h[index] !== null && h[index] !== undefined);
    svg.dataset.points = String(points.length);
    if (points.length) {
      const end = points[points.length - 1][0];
      const start = end - 5 * 60 * 1000;
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", points.map((h) => {
        const x = ((h[0] - start) / (end - start)) * width;
        const y = height - 2 - (Math.min(h[index], top) / top) * (height - 4);
        return `${x.toFixed(1)},${y.toFixed(1)}`;
      }).join(" "));
      svg.appendChild(line);
    }
    const figure = el("figure", { cls: "ext-chart" });
    figure.appendChild(svg);
    figure.appendChild(el("figcaption", { cls: "muted small", text: label + " · 5 min" }));
    return figure;
  }

  // ------------------------------------------------------------------------------ heap

  function renderHeapInfo(vm) {
    if (vm && vm.ddm === false) {
      renderJvmHeap(state.jvmHeap);
      return;
    }
    const heaps = vm ? vm.heaps || [] : [];
    const tbody = $("heaps").tBodies[0];
    const rows = document.createDocumentFragment();
    for (const h of heaps) {
      const used = h.size ? (100 * h.bytes_allocated) / h.size : null;
      const tr = el("tr", { data: { heapId: h.heap_id } });
      tr.appendChild(el("td", { text: `#${h.heap_id}` }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(h.size) }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(h.max_size) }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(h.bytes_allocated) }));
      tr.appendChild(el("td", { cls: "num", text: formatCount(h.objects_allocated) }));
      const usedCell = el("td", { cls: "num" });
      if (used !== null) {
        const meter = el("span", { cls: "meter" });
        const bar = el("span", { cls: "meter-bar" });
        bar.style.width = `${Math.min(100, used).toFixed(1)}%`;
        meter.appendChild(bar);
        usedCell.appendChild(meter);
        usedCell.appendChild(el("span", { text: ` ${used.toFixed(0)}%` }));
      } else {
        usedCell.textContent = "—";
      }
      tr.appendChild(usedCell);
      tr.appendChild(el("td", { cls: "muted small", text: h.timestamp_ms ? clock(new Date(h.timestamp_ms)) : "" }));
      rows.appendChild(tr);
    }
    tbody.replaceChildren(rows);
    show($("heaps"), heaps.length > 0);
  }

  // A plain JVM's GC.heap_info in the heap table: the Java heap, then each space it lists
  // (Metaspace's Max is the address space it reserved). Objects are not counted there.
  function renderJvmHeap(heap) {
    const spaces = heap ? heap.spaces || [] : [];
    const java = spaces.filter((s) => s.kind === "heap" && !s.part_of);
    const lines = [];
    if (heap && heap.used !== null) {
      const name = `Java heap${heap.collector ? ` (${heap.collector})` : ""}`;
      lines.push({ name, used: heap.used, committed: heap.committed, max: heap.max });
    }
    for (const s of spaces) {
      if (s.kind === "heap" && java.length < 2) continue; // the Java heap's row says it
      lines.push({ name: s.part_of ? `${s.part_of} · ${s.name}` : s.name, used: s.used,
        committed: s.committed, max: s.max });
    }
    const rows = document.createDocumentFragment();
    for (const line of lines) {
      const tr = el("tr", { data: { space: line.name } });
      tr.appendChild(el("td", { text: line.name }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(line.committed) }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(line.max) }));
      tr.appendChild(el("td", { cls: "num", text: formatBytes(line.used) }));
      tr.appendChild(el("td", { cls: "num", text: "—" }));
      const usedCell = el("td", { cls: "num", text: "—" });
      if (line.committed) {
        const used = (100 * line.used) / line.committed;
        const meter = el("span", { cls: "meter" });
        const bar = el("span", { cls: "meter-bar" });
        bar.style.width = `${Math.min(100, used).toFixed(1)}%`;
        meter.appendChild(bar);
        usedCell.replaceChildren(meter, el("span", { text: ` ${used.toFixed(0)}%` }));
      }
      tr.appendChild(usedCell);
      tr.appendChild(el("td", { cls: "muted small", text: state.jvmHeapAt ? clock(state.jvmHeapAt) : "" }));
      rows.appendChild(tr);
    }
    $("heaps").tBodies[0].replaceChildren(rows);
    show($("heaps"), lines.length > 0);
  }

  async function loadLegend() {
    if (state.legend) return state.legend;
    try {
      state.legend = await apiJson("/heap/legend");
    } catch (_) {
      state.legend = null;
    }
    return state.legend;
  }

  async function loadHeap(id) {
    try {
      const body = await apiJson(vmPath(id) + "/heap");
      if (state.shown !== id) return;
      state.heapImages = body.images || [];
      state.jvmHeap = body.jvm_heap || null;
      state.jvmHeapAt = new Date();
      state.heapOrigins = body.origins || null;
      renderOrigins();
      if (state.heapImages.length) await loadHeapPicture(id);
      updateShownVm();
    } catch (err) {
      if (state.shown !== id) return;
      if (err.status !== 501) setText($("heap-status"), `Heap: ${err.message}`);
      if (err.status === 501 && (shownVm() || {}).ddm === false) {
        state.jvmHeapWhy = sentence(err.message); // the JVM cannot be attached: why
        updateShownVm();
      }
    }
  }

  function pickImage(images) {
    const java = images.filter((i) => !i.native);
    const pool = java.length ? java : images;
    return [...pool].sort((a, b) => a.heap_id - b.heap_id)[0] || null;
  }

  async function loadHeapPicture(id) {
    const image = pickImage(state.heapImages);
    const query = `?width=${HEAP_WIDTH}&height=${HEAP_HEIGHT}` + (image ? `&heap=${image.heap_id}` : "");
    const headers = state.heapEtag ? { "If-None-Match": state.heapEtag } : {};
    const response = await api(vmPath(id) + "/heap.png" + query, { accept: "image/png", headers });
    if (state.shown !== id) return;
    if (response.status === 304) return;
    if (response.status === 404) {
      show($("heap-view"), false);
      return;
    }
    if (!response.ok) {
      let message = response.statusText;
      try {
        message = (await response.json()).error || message;
      } catch (_) { /* not JSON */ }
      setText($("heap-status"), `Heap picture: ${message}`);
      return;
    }
    const blob = await response.blob();
    if (state.shown !== id) return;
    const layout = parseLayout(response.headers.get("X-Heap-Layout"));
    const url = URL.createObjectURL(blob);
    const img = $("heap-img");
    const loaded = new Promise((resolve) => {
      img.onload = resolve;
      img.onerror = resolve;
    });
    img.src = url;
    await loaded;
    if (state.heapUrl) URL.revokeObjectURL(state.heapUrl);
    state.heapUrl = url;
    state.heapEtag = response.headers.get("ETag");
    img.dataset.etag = state.heapEtag || "";
    img.dataset.heapId = response.headers.get("X-Heap-Id") || "";
    if (layout) {
      img.width = layout.width;
      img.height = layout.height;
    }
    renderHeapSummary(image, layout);
    await renderLegend(image);
    note($("heap-note"), "");
    show($("heap-view"), true);
  }

  function parseLayout(text) {
    if (!text) return null;
    try {
      return JSON.parse(text);
    } catch (_) {
      return null;
    }
  }

  function figure(list, label, value, title) {
    const dt = el("dt", { text: label });
    const dd = el("dd", { text: value, title });
    list.appendChild(dt);
    list.appendChild(dd);
  }

  function renderHeapSummary(image, layout) {
    const list = $("heap-summary");
    list.replaceChildren();
    if (!image) return;
    const s = image.summary;
    figure(list, "Used", formatBytes(s.bytes_used));
    figure(list, "Free", formatBytes(s.bytes_free), "free space between allocations");
    figure(list, "Largest free run", formatBytes(s.largest_free_run));
    // Not an alarm: a healthy heap's free space is spread over many small runs between live
    // objects, so "1 − largest free run / free bytes" is high; what matters is the largest run.
    figure(list, "Free space spread", `${(100 * s.fragmentation).toFixed(0)}% outside the largest run`,
      "how much of the free space lies outside the largest free run; high is normal for a " +
      "heap between collections, and a large allocation needs one run of its size");
    figure(list, "Free runs", formatCount(s.free_run_count));
    if (s.object_count !== null) figure(list, "Objects", formatCount(s.object_count));
    figure(list, "Segments", formatCount(s.segment_count));
    if (s.span) {
      figure(list, "Span", `${hex(s.span[0])}–${hex(s.span[1])}`, formatBytes(s.span[1] - s.span[0]));
    }
    const problems = [];
    if (!image.complete) problems.push("incomplete dump");
    if (image.problems && image.problems.length) problems.push(`${image.problems.length} problem(s)`);
    const caption = [`heap #${image.heap_id}`];
    if (layout) caption.push(describeScale(layout), `${layout.bytes_per_row ? formatBytes(layout.bytes_per_row) : "?"} a row`);
    caption.push(`drawn ${clock(new Date())}`);
    if (problems.length) caption.push(problems.join(", "));
    setText($("heap-caption"), caption.join(" · "));
  }

  function describeScale(layout) {
    if (layout.cell > 1) return `1 unit (${layout.unit_size} B) = ${layout.cell}×${layout.cell} px`;
    if (layout.units_per_pixel === 1) return `1 px = 1 unit (${layout.unit_size} B)`;
    return `1 px = ${formatBytes(layout.bytes_per_pixel)} (${layout.units_per_pixel} units)`;
  }

  async function renderLegend(image) {
    const legend = await loadLegend();
    const list = $("legend");
    list.replaceChildren();
    if (!legend) return;
    const byKind = image ? image.summary.bytes_by_kind || {} : {};
    const groups = [["space", "Space"], ["kind", "Kind (hard reachable)"], ["solidity", "Reachability"]];
    for (const [group, title] of groups) {
      const entries = legend.entries.filter((e) => e.group === group);
      if (group === "solidity") {
        // Shipped VMs send only free and hard: list the rest only when the dump has them.
        const present = image ? image.summary.bytes_by_solidity || {} : {};
        const shown = entries.filter((e) => e.key !== "hard" && present[e.key]);
        if (!shown.length) continue;
        list.appendChild(el("li", { cls: "legend-head", text: title }));
        for (const e of shown) list.appendChild(legendItem(e, present[e.key]));
        continue;
      }
      list.appendChild(el("li", { cls: "legend-head", text: title }));
      for (const e of entries) {
        let amount = null;
        if (group === "kind") amount = byKind[e.key] || 0;
        if (group === "space" && e.key === "free" && image) amount = image.summary.bytes_free;
        list.appendChild(legendItem(e, amount));
      }
    }
  }

  function legendItem(entry, amount) {
    const li = el("li", { data: { key: entry.key } });
    const swatch = el("span", { cls: "swatch" });
    swatch.style.background = /^#[0-9a-f]{6}$/i.test(entry.colour) ? entry.colour : "transparent";
    li.appendChild(swatch);
    li.appendChild(el("span", { cls: "legend-label", text: entry.label }));
    if (amount !== null && amount !== undefined) {
      li.appendChild(el("span", { cls: "legend-amount", text: formatBytes(amount) }));
    }
    if (amount === 0) li.classList.add("absent");
    return li;
  }

  async function causeGc() {
    const id = state.shown;
    if (!id) return;
    const button = $("gc");
    button.disabled = true;
    button.classList.add("busy");
    state.gcRunning = true;
    setText($("heap-status"), "GC running; waiting for the heap dump…");
    try {
      if ((shownVm() || {}).ddm === false) { // a plain JVM: GC.run, then GC.heap_info
        const done = await apiJson(vmPath(id) + "/gc", { method: "POST" });
        if (state.shown !== id) return;
        state.jvmHeap = done.jvm_heap || state.jvmHeap;
        state.jvmHeapAt = new Date();
        state.heapOrigins = done.origins || state.heapOrigins;
        renderOrigins();
        setText($("heap-status"), `GC done at ${clock(new Date())} (GC.run)`);
        return;
      }
      if (((shownVm() || {}).missing || {}).HPSG) { // known: no segments come, the GC only
        const done = await apiJson(vmPath(id) + "/gc", { method: "POST" });
        if (state.shown !== id) return;
        state.heapOrigins = done.origins || state.heapOrigins;
        renderOrigins();
        setText($("heap-status"), `GC requested at ${clock(new Date())} (no heap segments from this VM)`);
        return;
      }
      const body = await apiJson(vmPath(id) + "/heap/dump", { method: "POST" });
      if (state.shown !== id) return;
      state.heapImages = body.images || [];
      state.heapOrigins = body.origins || null;
      renderOrigins();
      if (state.heapImages.length) {
        await loadHeapPicture(id);
        setText($("heap-status"), `GC + heap dump at ${clock(new Date())}`);
      } else {
        setText($("heap-status"), "GC done; the VM sent no heap segments");
      }
    } catch (err) {
      if (state.shown !== id) return;
      if (err.status === 501 || err.status === 504) {
        // No heap segments from this VM: a plain GC may still work.
        try {
          await apiJson(vmPath(id) + "/gc", { method: "POST" });
          setText($("heap-status"), `GC requested at ${clock(new Date())} (no heap segments from this VM)`);
        } catch (gcErr) {
          setText($("heap-status"), `GC failed: ${gcErr.message}`);
        }
      } else {
        setText($("heap-status"), `GC failed: ${err.message}`);
      }
    } finally {
      state.gcRunning = false;
      button.classList.remove("busy");
      button.disabled = false;
      updateShownVm();
      queueRefresh();
    }
  }

  // ------------------------------------------------------------------------------ logcat
  //
  // The shown VM's log: its app's lines (across restarts), or the whole device's. A JSON
  // fetch of the recent lines, then an EventSource on .../logcat/stream for the new ones,
  // resumed after the last sequence number seen. Level, tags, text and "whole device" are
  // filtered in ddmd (a filter change asks again), so a busy device sends only what is shown.
  //
  // Bounded: at most LOGCAT_MAX_ROWS rows are kept (a multi-line message is one row per line,
  // as `adb logcat` prints it), and only the rows in view are in the page: a fixed row height,
  // a spacer as tall as every row, and a pool of row elements repainted once per animation
  // frame however many batches came. While paused, new lines wait (and are counted); the view
  // follows the newest line until the user scrolls up, and again once back at the bottom.
  // Without an event stream (a token given only in this tab, an older browser) it polls.

  const LOGCAT_LEVELS = ["V", "D", "I", "W", "E", "F"];
  const LOGCAT_ROW_PX = 18; // = .logcat-row height in style.css
  const LOGCAT_MAX_ROWS = 20000;
  const LOGCAT_TRIM = 2000; // rows dropped at once when full (not one by one)
  const LOGCAT_BACKLOG = 2000; // lines asked for when the panel opens or a filter changes
  const LOGCAT_MESSAGE_LINES = 200; // lines of one message shown; the rest are counted
  const LOGCAT_OVERSCAN = 8; // rows painted above and below the view
  const LOGCAT_TYPING_MS = 350;
  const LOGCAT_RETRY_MS = 2000;
  const LOGCAT_POLL_MS = 1000;
  const CRASH_WORDS = { java: "Java crash", native: "native crash", anr: "ANR", died: "died" };

  const lc = {
    gen: 0, // bumped when the stream is (re)started or stopped
    level: "V",
    source: null,
    timer: null,
    typing: null,
    rows: [], // {item, text, line, start}
    pending: [], // items that came while paused
    pendingLines: 0,
    paused: false,
    follow: true,
    cursor: 0, // the newest sequence number seen (device-wide): where a stream resumes
    lines: 0, // log lines received since the list was last emptied
    dropped: false, // the oldest rows were dropped
    shift: 0, // rows dropped from the top since the last paint
    last: null, // the last item added (where a crash block starts)
    frame: 0,
    pool: [],
    mode: "",
    blocked: "", // "name": the VM has no name yet; "off": no log at all
  };

  function logcatQuery(extra) {
    const q = new URLSearchParams();
    if (lc.level !== "V") q.set("level", lc.level);
    for (const tag of $("logcat-tag").value.split(",")) {
      const t = tag.trim();
      if (t) q.append("tag", t);
    }
    const grep = $("logcat-grep").value;
    if (grep.trim()) q.set("grep", grep);
    if ($("logcat-all").checked) q.set("all", "1");
    for (const [key, value] of Object.entries(extra)) q.set(key, String(value));
    return q.toString();
  }

  function logcatClear() {
    lc.rows = [];
    lc.pending = [];
    lc.pendingLines = 0;
    lc.lines = 0;
    lc.dropped = false;
    lc.shift = 0;
    lc.last = null;
    lc.follow = true;
    logcatSchedule();
  }

  function logcatStop() {
    lc.gen += 1;
    if (lc.source) lc.source.close();
    lc.source = null;
    clearTimeout(lc.timer);
    lc.timer = null;
    clearTimeout(lc.typing);
    lc.typing = null;
    lc.mode = "";
    delete $("logcat-panel").dataset.stream;
  }

  // Opens the panel for VM `id` (a new VM: not paused, no crash shown, empty list).
  function logcatOpenVm(id) {
    lc.paused = false;
    show($("logcat-crash"), false);
    setText($("logcat-where"), "");
    const vm = shownVm();
    if (vm && !vm.device) {
      // A workstation JVM: the daemon's answer (501) is known without asking, and asking
      // would only add a failed request to the browser's console.
      logcatStop();
      logcatClear();
      lc.blocked = "off";
      show($("logcat-body"), false);
      note($("logcat-note"), sentence(vm.logcat || workstationSentence(vm)));
      return;
    }
    logcatStart(id);
  }

  // The daemon says why in the VM's "logcat" field; these words are only for an older daemon.
  function workstationSentence(vm) {
    return `${vmName(vm)} runs on a local port, not on an Android device: it has no device ` +
      "log (only Android devices and emulators keep a log ddmd can read)";
  }

  function logcatCloseVm() {
    logcatStop();
    logcatClear();
    lc.cursor = 0;
    lc.blocked = "";
    show($("logcat-crash"), false);
  }

  async function logcatStart(id) {
    logcatStop();
    const gen = lc.gen;
    lc.cursor = 0;
    lc.blocked = "";
    logcatClear();
    note($("logcat-note"), "");
    note($("logcat-error"), "");
    show($("logcat-body"), true);
    lc.mode = "loading";
    logcatSchedule();
    let body;
    try {
      body = await apiJson(vmPath(id) + "/logcat?" + logcatQuery({ since: LOGCAT_BACKLOG }));
    } catch (err) {
      if (gen === lc.gen) logcatFailed(err, gen, id);
      return;
    }
    if (gen !== lc.gen) return;
    setText($("logcat-where"), body.app
      ? `${body.app} on ${body.device}` : `every app on ${body.device}`);
    logcatReceive(body.items, true);
    lc.cursor = Math.max(lc.cursor, Number(body.next) || 0);
    logcatOpen(gen, id);
  }

  function logcatOpen(gen, id) {
    if (typeof EventSource === "undefined") {
      logcatPoll(gen, id);
      return;
    }
    const url = API + vmPath(id) + "/logcat/stream?" + logcatQuery({ after: lc.cursor });
    let source;
    try {
      source = new EventSource(url);
    } catch (_) {
      logcatPoll(gen, id);
      return;
    }
    lc.source = source;
    lc.mode = "connecting";
    logcatSchedule();
    let opened = false;
    const mine = () => gen === lc.gen && lc.source === source;
    source.onopen = () => {
      if (!mine()) return;
      opened = true;
      lc.mode = "live";
      $("logcat-panel").dataset.stream = url.slice(url.indexOf("?") + 1); // what ddmd was asked
      note($("logcat-error"), "");
      logcatSchedule();
    };
    source.addEventListener("logcat.lines", (event) => {
      if (!mine()) return;
      let data = null;
      try {
        data = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      if (data && typeof data === "object") logcatReceive(data.items, false);
    });
    source.onerror = () => {
      if (!mine()) return;
      // Reopened by hand (not by the browser), so it resumes after the last line seen.
      source.close();
      lc.source = null;
      if (opened) {
        lc.mode = "reconnecting";
        logcatSchedule();
        lc.timer = setTimeout(() => {
          if (gen === lc.gen) logcatOpen(gen, id);
        }, LOGCAT_RETRY_MS);
      } else {
        // Never opened: no stream for this page (or an error answer): the JSON route says why.
        logcatPoll(gen, id);
      }
    };
  }

  async function logcatPoll(gen, id) {
    lc.mode = "polling";
    logcatSchedule();
    try {
      const body = await apiJson(vmPath(id) + "/logcat?" + logcatQuery({ after: lc.cursor }));
      if (gen !== lc.gen) return;
      logcatReceive(body.items, false);
      lc.cursor = Math.max(lc.cursor, Number(body.next) || 0);
      note($("logcat-error"), "");
    } catch (err) {
      if (gen === lc.gen) logcatFailed(err, gen, id);
      return;
    }
    lc.timer = setTimeout(() => {
      if (gen === lc.gen) logcatPoll(gen, id);
    }, LOGCAT_POLL_MS);
  }

  function logcatFailed(err, gen, id) {
    lc.mode = "";
    const target = String((err.body && err.body.target) || "");
    if (err.status === 501) {
      // A workstation JVM, or ddmd does not read device logs: the daemon's sentence only.
      lc.blocked = "off";
      show($("logcat-body"), false);
      note($("logcat-note"), sentence(err.message));
    } else if (err.status === 405 || (err.status === 404 && /\/logcat(\/stream)?$/.test(target))) {
      lc.blocked = "off";
      show($("logcat-body"), false);
      note($("logcat-note"), "This daemon does not read device logs.");
    } else if (err.status === 404 || err.status === 410) {
      note($("logcat-note"), "This VM is gone: its log stops here.");
    } else if (err.status === 409) {
      // Not named yet: asked again when it is (updateShownVm); "Whole device" works now.
      lc.blocked = "name";
      note($("logcat-note"), sentence(err.message));
    } else if (err.status === 400 || err.status === 401) {
      note($("logcat-error"), sentence(err.message)); // a bad filter: the user fixes it
    } else {
      note($("logcat-error"), `Logcat unavailable: ${sentence(err.message)} Trying again…`);
      lc.timer = setTimeout(() => {
        if (gen === lc.gen) logcatPoll(gen, id);
      }, LOGCAT_RETRY_MS * 2);
    }
    logcatSchedule();
  }

  // New items from ddmd: dropped if seen already (a resumed stream), held while paused.
  function logcatReceive(items, backlog) {
    if (!Array.isArray(items) || !items.length) return;
    const fresh = [];
    for (const item of items) {
      if (!item || typeof item !== "object") continue;
      const seq = Number(item.seq);
      if (Number.isFinite(seq)) {
        if (seq <= lc.cursor) continue;
        lc.cursor = seq;
      }
      fresh.push(item);
    }
    if (!fresh.length) return;
    if (lc.paused && !backlog) {
      for (const item of fresh) {
        lc.pending.push(item);
        if (item.kind !== "restart") lc.pendingLines += 1;
      }
      if (lc.pending.length > LOGCAT_MAX_ROWS + LOGCAT_TRIM) {
        lc.pending.splice(0, lc.pending.length - LOGCAT_MAX_ROWS);
      }
    } else {
      logcatAppend(fresh);
    }
    logcatSchedule();
  }

  function logcatAppend(items) {
    const rows = lc.rows;
    for (const item of items) {
      if (item.kind === "restart") {
        rows.push({ item, text: String(item.text || "the app restarted"), line: 0, start: false });
        lc.last = item;
        continue;
      }
      lc.lines += 1;
      const crash = item.crash || null;
      const last = lc.last;
      // One block: consecutive lines of one crash kind about one app (a tombstone's lines
      // come from crash_dump's pid, its "Fatal signal" line from the app's).
      const start = Boolean(crash) &&
        !(last && last.kind !== "restart" && last.crash === crash && last.app === item.app);
      const parts = String(item.message ?? "").replace(/\n+$/, "").split("\n");
      const shown = Math.min(parts.length, LOGCAT_MESSAGE_LINES);
      for (let i = 0; i < shown; i += 1) rows.push({ item, text: parts[i], line: i, start: start && i === 0 });
      if (shown < parts.length) {
        rows.push({ item, text: `… ${parts.length - shown} more lines`, line: shown, start: false });
      }
      lc.last = item;
    }
    if (rows.length > LOGCAT_MAX_ROWS) {
      const cut = rows.length - LOGCAT_MAX_ROWS + LOGCAT_TRIM;
      rows.splice(0, cut);
      lc.shift += cut;
      lc.dropped = true;
    }
  }

  function logcatSchedule() {
    if (!lc.frame) lc.frame = requestAnimationFrame(logcatPaint);
  }

  function logcatTime(item) {
    if (item.clock === undefined) {
      const text = String(item.time || "");
      // "2024-05-01T12:00:00.123456Z": to the millisecond, in this browser's time zone.
      const date = new Date(text.length > 24 ? text.slice(0, 23) + "Z" : text);
      item.clock = Number.isNaN(date.getTime()) ? text
        : `${clock(date)}.${String(date.getMilliseconds()).padStart(3, "0")}`;
    }
    return item.clock;
  }

  function logcatRowNode() {
    const node = el("div", { cls: "logcat-row" });
    for (const cls of ["lc-time", "lc-pid", "lc-level", "lc-tag", "lc-badge", "lc-msg"]) {
      node.appendChild(el("span", { cls }));
    }
    return node;
  }

  function logcatFill(node, row, index) {
    const item = row.item;
    const [time, pid, level, tag, badge, message] = node.children;
    node.dataset.index = String(index);
    node.dataset.seq = String(item.seq);
    if (item.kind === "restart") {
      node.className = "logcat-row restart";
      for (const cell of [time, pid, level, tag, badge]) setText(cell, "");
      setText(message, row.text);
      node.title = "";
      return;
    }
    const letter = LOGCAT_LEVELS.includes(item.level) ? item.level : "V";
    let cls = `logcat-row lv-${letter}`;
    if (row.line > 0) cls += " more";
    if (item.crash) cls += ` crash crash-${CRASH_WORDS[item.crash] ? item.crash : "other"}`;
    if (row.start) cls += " crash-start";
    if (node.className !== cls) node.className = cls;
    const head = row.line === 0;
    setText(time, head ? logcatTime(item) : "");
    setText(pid, head ? item.pid : "");
    setText(level, letter);
    setText(tag, head ? item.tag : "");
    setText(badge, row.start ? CRASH_WORDS[item.crash] || String(item.crash) : "");
    setText(message, row.text);
    const title = `${item.app || "pid " + item.pid} · pid ${item.pid} tid ${item.tid}` +
      (item.buffer ? ` · ${item.buffer}` : "");
    if (node.title !== title) node.title = title;
  }

  function logcatPaint() {
    lc.frame = 0;
    const view = $("logcat-view");
    const total = lc.rows.length;
    const sizer = $("logcat-sizer");
    const height = `${total * LOGCAT_ROW_PX}px`;
    if (sizer.style.height !== height) sizer.style.height = height;
    if (lc.follow) {
      view.scrollTop = view.scrollHeight;
    } else if (lc.shift) {
      view.scrollTop = Math.max(0, view.scrollTop - lc.shift * LOGCAT_ROW_PX);
    }
    lc.shift = 0;
    const top = view.scrollTop;
    const first = Math.max(0, Math.floor(top / LOGCAT_ROW_PX) - LOGCAT_OVERSCAN);
    const end = Math.min(total, Math.ceil((top + view.clientHeight) / LOGCAT_ROW_PX) + LOGCAT_OVERSCAN);
    const count = Math.max(0, end - first);
    const holder = $("logcat-rows");
    holder.style.transform = `translateY(${first * LOGCAT_ROW_PX}px)`;
    while (lc.pool.length < count) {
      const node = logcatRowNode();
      lc.pool.push(node);
      holder.appendChild(node);
    }
    for (const node of lc.pool.splice(count)) node.remove();
    for (let i = 0; i < count; i += 1) logcatFill(lc.pool[i], lc.rows[first + i], first + i);
    show($("logcat-follow"), !lc.follow && total > 0);
    logcatStatus();
  }

  function logcatStatus() {
    const words = { loading: "loading…", connecting: "connecting…", live: "live",
      reconnecting: "reconnecting…", polling: `polling every ${LOGCAT_POLL_MS / 1000} s` };
    const parts = [];
    if (lc.lines || lc.mode) parts.push(`${formatCount(lc.lines)} line${lc.lines === 1 ? "" : "s"}`);
    if (lc.dropped) parts.push(`the newest ${formatCount(LOGCAT_MAX_ROWS)} rows kept`);
    if (words[lc.mode]) parts.push(words[lc.mode]);
    setText($("logcat-status"), parts.join(" · "));
    const pending = $("logcat-pending");
    setText(pending, lc.paused
      ? `paused · ${formatCount(lc.pendingLines)} new line${lc.pendingLines === 1 ? "" : "s"}` : "");
    show(pending, lc.paused);
    const pause = $("logcat-pause");
    setText(pause, lc.paused ? "Resume" : "Pause");
    pause.setAttribute("aria-pressed", String(lc.paused));
    for (const button of document.querySelectorAll("#logcat-panel .level")) {
      const at = LOGCAT_LEVELS.indexOf(button.dataset.level);
      button.classList.toggle("on", at >= LOGCAT_LEVELS.indexOf(lc.level));
      button.setAttribute("aria-pressed", String(button.dataset.level === lc.level));
    }
    const empty = lc.rows.length === 0 && (lc.mode === "live" || lc.mode === "polling");
    note($("logcat-empty"), empty ? (lc.paused && lc.pendingLines ? "" : "No lines yet.") : "");
  }

  function logcatScrolled() {
    const view = $("logcat-view");
    const bottom = view.scrollTop + view.clientHeight >= view.scrollHeight - LOGCAT_ROW_PX / 2;
    lc.follow = bottom;
    logcatSchedule();
  }

  function logcatRestart() {
    clearTimeout(lc.typing);
    lc.typing = null;
    if (state.shown && lc.blocked !== "off") logcatStart(state.shown);
  }

  function logcatTyped() {
    clearTimeout(lc.typing);
    lc.typing = setTimeout(logcatRestart, LOGCAT_TYPING_MS);
  }

  function logcatPause() {
    lc.paused = !lc.paused;
    if (!lc.paused && lc.pending.length) {
      const held = lc.pending;
      lc.pending = [];
      logcatAppend(held);
    }
    if (!lc.paused) lc.pendingLines = 0;
    logcatSchedule();
  }

  // `app.crashed` on the event stream: a badge in the panel's head (the lines themselves come
  // with the log, marked), for the shown VM's app or, with "whole device", any app on it.
  function logcatCrashed(data) {
    const vm = shownVm();
    if (!vm || !vm.device || !data || data.device !== vm.device) return;
    if (!$("logcat-all").checked && data.app !== (vm.package || vm.app)) return;
    const badge = $("logcat-crash");
    const words = CRASH_WORDS[data.kind] || String(data.kind || "crash");
    setText(badge, `${words}: ${data.app || "pid " + data.pid} at ${clock(new Date())}`);
    badge.dataset.kind = String(data.kind || "");
    show(badge, true);
  }

  function logcatShowCrash() {
    let index = -1;
    for (let i = lc.rows.length - 1; i >= 0; i -= 1) {
      if (lc.rows[i].start) {
        index = i;
        break;
      }
    }
    if (index < 0) return;
    lc.follow = false;
    $("logcat-view").scrollTop = Math.max(0, index - 2) * LOGCAT_ROW_PX;
    logcatSchedule();
  }

  function initLogcat() {
    for (const button of document.querySelectorAll("#logcat-panel .level")) {
      button.addEventListener("click", () => {
        if (lc.level === button.dataset.level) return;
        lc.level = button.dataset.level;
        logcatRestart();
      });
    }
    for (const id of ["logcat-tag", "logcat-grep"]) {
      const input = $(id);
      input.addEventListener("input", logcatTyped);
      input.addEventListener("keydown", (e) => {
        if (e.key === "Enter") logcatRestart();
      });
    }
    $("logcat-all").addEventListener("change", logcatRestart);
    $("logcat-pause").addEventListener("click", logcatPause);
    $("logcat-clear").addEventListener("click", logcatClear);
    $("logcat-follow").addEventListener("click", () => {
      lc.follow = true;
      logcatSchedule();
    });
    $("logcat-crash").addEventListener("click", logcatShowCrash);
    $("logcat-view").addEventListener("scroll", logcatScrolled, { passive: true });
    window.addEventListener("resize", logcatSchedule);
    logcatStatus();
  }

  // ------------------------------------------------------------------------------ profiling
  //
  // DDMS's profiling buttons: method trace, heap dump, allocation tracker, kill. What the VM
  // offers comes from GET .../profiling; a feature it lacks has its buttons disabled and the
  // daemon's sentence beside them. Trace and heap files are fetched with api() (so the token
  // header goes with them) when their link is first clicked, then saved from a blob URL.
  //
  // Per tool: `TOOL-state` says what it is doing (tracing, tracking on, dumping…), `TOOL-error`
  // why the last button failed, `TOOL-reason` why the VM cannot do it at all; the results
  // (tables, download link, their captions) stay until the next result or another VM.

  const PROF_TOOLS = ["trace", "hprof", "allocs", "kill"];
  const PROF_BUTTONS = {
    trace: ["trace-start", "trace-stop"],
    hprof: ["hprof-dump"],
    allocs: ["allocs-start", "allocs-stop", "allocs-refresh"],
    kill: ["kill"],
  };
  const ALLOC_ROWS = 50;
  const PRIMITIVES = {
    Z: "boolean", B: "byte", C: "char", S: "short", I: "int", J: "long", F: "float", D: "double",
    V: "void",
  };

  const prof = {
    gen: 0, // bumped when the panel is opened, closed or its VM goes away
    body: null, // the last GET .../profiling answer
    tracking: null, // allocation tracking on/off as the tracker itself last said (or null)
    busy: new Set(), // tools with a request under way
    ddm: undefined, // the shown VM's `ddm` when its profiling was last asked for
    urls: [], // blob URLs to revoke when the panel changes
  };

  // "Lcom/example/Foo;" -> "com.example.Foo", "[B" -> "byte[]"; other names stay as they are.
  function javaName(name) {
    const text = String(name ?? "?");
    const dotted = (s) => s.slice(1, -1).split("/").join(".");
    if (text.length > 2 && text.startsWith("L") && text.endsWith(";") && !text.includes(".")) {
      return dotted(text);
    }
    if (text.startsWith("[")) {
      const element = text.replace(/^\[+/, "");
      const dims = text.length - element.length;
      let base;
      if (element.length === 1 && Object.prototype.hasOwnProperty.call(PRIMITIVES, element)) {
        base = PRIMITIVES[element];
      } else if (element.length > 2 && element.startsWith("L") && element.endsWith(";")) {
        base = dotted(element);
      } else {
        return text;
      }
      return base + "[]".repeat(dims);
    }
    return text;
  }

  function frameText(frame) {
    let where;
    if (frame.line === -2) where = "Native Method";
    else if (frame.file && frame.line >= 0) where = `${frame.file}:${frame.line}`;
    else where = frame.file || "Unknown Source";
    return `${javaName(frame.class)}.${frame.method}(${where})`;
  }

  // The daemon's words as a sentence: a full stop last, and a capital first when the first
  // word is a plain word ("this VM ..."), never when it is a name ("com.example.maps ...").
  function sentence(text) {
    const s = String(text).trim();
    if (!s) return s;
    const first = s.split(/\s/, 1)[0];
    const head = /^[a-z]+$/.test(first) ? s.charAt(0).toUpperCase() + s.slice(1) : s;
    return head + (/[.!?]$/.test(s) ? "" : ".");
  }

  function profState(tool, text) {
    setText($(`${tool}-state`), text);
  }

  function allocsTracking() {
    const said = prof.body ? prof.body.allocs : undefined;
    return typeof said === "boolean" ? said : prof.tracking;
  }

  function showTracking() {
    if (prof.busy.has("allocs")) return;
    const feature = prof.body && prof.body.features ? prof.body.features.allocs : null;
    const on = allocsTracking();
    profState("allocs", !feature || !feature.available || on === null || on === undefined
      ? "" : on ? "tracking on" : "tracking off");
  }

  function setProfButtons() {
    const body = prof.body;
    const features = (body && body.features) || {};
    const usable = (tool) => Boolean(features[tool] && features[tool].available) && !prof.busy.has(tool);
    const tracing = body ? body.trace : "off";
    $("trace-start").disabled = !usable("trace") || (tracing !== "off" && tracing !== "unknown");
    $("trace-stop").disabled = !usable("trace") || tracing === "off";
    $("hprof-dump").disabled = !usable("hprof");
    const tracking = allocsTracking();
    $("allocs-start").disabled = !usable("allocs") || tracking === true;
    $("allocs-stop").disabled = !usable("allocs") || tracking === false;
    $("allocs-refresh").disabled = !usable("allocs");
    const shownVm_ = shownVm();
    // A DDM client that is no VM (ddmd sysmon) is not killed from here.
    $("kill").disabled = !usable("kill") || Boolean(shownVm_ && shownVm_.kind && shownVm_.kind !== "VM");
  }

  function renderProfiling(body) {
    prof.body = body;
    const features = body.features || {};
    for (const tool of PROF_TOOLS) {
      const feature = features[tool] || { available: false, reason: "the daemon did not say" };
      const reason = feature.available ? "" : sentence(feature.reason || "this VM does not offer it");
      note($(`${tool}-reason`), reason);
      $(`prof-${tool}`).classList.toggle("unavailable", !feature.available);
      for (const id of PROF_BUTTONS[tool]) $(id).title = reason;
    }
    if (!prof.busy.has("trace")) {
      const tracing = body.trace;
      profState("trace", tracing === "method" || tracing === "sampling" ? `tracing (${tracing})…` : "");
    }
    showTracking();
    setProfButtons();
  }

  function resetProfiling() {
    prof.gen += 1;
    prof.body = null;
    prof.tracking = null;
    prof.ddm = undefined;
    prof.busy.clear();
    for (const url of prof.urls) URL.revokeObjectURL(url);
    prof.urls = [];
    for (const tool of PROF_TOOLS) {
      note($(`${tool}-reason`), "");
      note($(`${tool}-error`), "");
      profState(tool, "");
      $(`prof-${tool}`).classList.remove("unavailable");
    }
    for (const id of ["trace-result", "hprof-result", "allocs-result"]) show($(id), false);
    for (const id of ["trace-methods", "hprof-classes", "allocs-list", "allocs-classes"]) {
      $(id).tBodies[0].replaceChildren();
    }
    note($("prof-note"), "");
    setProfButtons();
  }

  function profilingGone(text) {
    prof.gen += 1;
    prof.body = null;
    prof.busy.clear();
    note($("prof-note"), text);
    setProfButtons();
  }

  async function loadProfiling(id) {
    const gen = prof.gen;
    try {
      const body = await apiJson(vmPath(id) + "/profiling");
      if (gen !== prof.gen || state.shown !== id) return;
      note($("prof-note"), "");
      renderProfiling(body);
    } catch (err) {
      if (gen !== prof.gen || state.shown !== id) return;
      prof.body = null;
      setProfButtons();
      // An older daemon has no such route: its VM route answers for "ID/profiling".
      const target = String((err.body && err.body.target) || "");
      let text = `Profiling unavailable: ${err.message}`;
      if (err.status === 405 || (err.status === 404 && target.endsWith("/profiling"))) {
        text = "This daemon does not offer method tracing, heap dumps or the allocation tracker.";
      } else if (err.status === 404 || err.status === 410 || err.status === 503) {
        text = "This VM is gone.";
      }
      note($("prof-note"), text);
    }
  }

  // Runs one button's request: the tool's buttons are disabled meanwhile, a failure is shown
  // beside them, and the VM's state is asked again afterwards (unless `reload` is false).
  // `work` sets the tool's state line on success; a failure clears it.
  async function profAction(tool, busyText, work, reload = true) {
    const id = state.shown;
    if (!id || prof.busy.has(tool)) return;
    const gen = prof.gen;
    const current = () => gen === prof.gen && state.shown === id;
    prof.busy.add(tool);
    setProfButtons();
    note($(`${tool}-error`), "");
    profState(tool, busyText);
    try {
      await work(id, current);
    } catch (err) {
      if (current()) {
        profState(tool, "");
        note($(`${tool}-error`), `${sentence(err.message)}`);
      }
    } finally {
      if (gen === prof.gen) {
        prof.busy.delete(tool);
        setProfButtons();
        if (reload && state.shown === id) await loadProfiling(id);
      }
    }
  }

  function capturePath(body) {
    const download = typeof body.download === "string" ? body.download : "";
    if (download.startsWith(API + "/captures/")) return download.slice(API.length);
    return "/captures/" + encodeURIComponent(String(body.file));
  }

  // A link that fetches the file on its first click and then saves it from a blob URL.
  function offerCapture(link, caption, body) {
    const name = String(body.file);
    link.textContent = `Download ${name}`;
    link.download = name;
    link.href = "#";
    link.dataset.ready = "";
    link.dataset.path = capturePath(body);
    delete link.dataset.bytes;
    setText(caption, formatBytes(body.bytes));
  }

  async function onCaptureClick(event) {
    const link = event.currentTarget;
    if (link.dataset.ready === "1") return; // the blob is there: let the browser save it
    event.preventDefault();
    if (link.dataset.loading === "1" || !link.dataset.path) return;
    const gen = prof.gen;
    const caption = link.nextElementSibling;
    link.dataset.loading = "1";
    setText(caption, "fetching…");
    try {
      const response = await api(link.dataset.path, { accept: "application/octet-stream" });
      if (!response.ok) {
        let message = response.statusText;
        try {
          message = (await response.json()).error || message;
        } catch (_) { /* not JSON */ }
        throw new ApiError(response.status, message, null);
      }
      const blob = await response.blob();
      if (gen !== prof.gen) return;
      const url = URL.createObjectURL(blob);
      prof.urls.push(url);
      link.href = url;
      link.dataset.ready = "1";
      link.dataset.bytes = String(blob.size);
      setText(caption, formatBytes(blob.size));
      link.click();
    } catch (err) {
      if (gen === prof.gen) setText(caption, `Download failed: ${err.message}`);
    } finally {
      delete link.dataset.loading;
    }
  }

  function cellRow(cells) {
    const tr = el("tr");
    for (const [cls, text, title] of cells) tr.appendChild(el("td", { cls, text, title }));
    return tr;
  }

  function startTrace() {
    return profAction("trace", "starting…", async (id, current) => {
      const body = await apiJson(vmPath(id) + "/trace/start", { method: "POST" });
      if (!current()) return;
      const where = body.mode === "file" ? ", into a file on the device" : "";
      profState("trace", `tracing (${body.trace || "method"}${where})…`);
    });
  }

  function stopTrace() {
    return profAction("trace", "stopping…", async (id, current) => {
      const body = await apiJson(vmPath(id) + "/trace/stop", { method: "POST" });
      if (!current()) return;
      profState("trace", "");
      offerCapture($("trace-link"), $("trace-caption"), body);
      const report = body.report || {};
      const clock = report.sort_clock;
      const everything = report.all_threads || {};
      const methods = everything.by_inclusive || [];
      const rows = document.createDocumentFragment();
      for (const m of methods) {
        // Class and method name; the signature and source file on hover.
        const short = m.class && m.name ? `${m.class}.${m.name}` : m.method;
        rows.appendChild(cellRow([
          ["mono", short, `${m.method}${m.source ? ` (${m.source})` : ""}`],
          ["num", formatCount(m.calls)],
          ["num", formatCount(m.inclusive_usec ? m.inclusive_usec[clock] : null)],
          ["num", formatCount(m.exclusive_usec ? m.exclusive_usec[clock] : null)],
        ]));
      }
      $("trace-methods").tBodies[0].replaceChildren(rows);
      const threads = (report.threads || []).length;
      setText($("trace-summary"), report.error ? sentence(report.error) :
        `${formatCount(report.records)} records, ${threads} thread${threads === 1 ? "" : "s"}; ` +
        `top ${methods.length} of ${formatCount(everything.methods)} methods by inclusive time` +
        (clock ? ` (${clock} clock, all threads)` : ""));
      show($("trace-result"), true);
    });
  }

  function dumpHeap() {
    return profAction("hprof", "dumping the heap…", async (id, current) => {
      const body = await apiJson(vmPath(id) + "/hprof", { method: "POST" });
      if (!current()) return;
      profState("hprof", "");
      offerCapture($("hprof-link"), $("hprof-caption"), body);
      const hist = body.histogram || {};
      const heaps = hist.heap_info ? hist.heaps || [] : [];
      const head = el("tr");
      head.appendChild(el("th", { text: "Class" }));
      for (const label of ["Instances", "Shallow bytes", ...heaps]) {
        head.appendChild(el("th", { cls: "num", text: label }));
      }
      $("hprof-classes").tHead.replaceChildren(head);
      const rows = document.createDocumentFragment();
      for (const c of hist.classes || []) {
        const shares = c.heaps || {};
        rows.appendChild(cellRow([
          ["mono", c.class],
          ["num", formatCount(c.instances)],
          ["num", formatCount(c.shallow_bytes)],
          ...heaps.map((h) => ["num", shares[h] ? formatCount(shares[h].instances) : ""]),
        ]));
      }
      $("hprof-classes").tBodies[0].replaceChildren(rows);
      setText($("hprof-summary"), hist.error ? sentence(hist.error) :
        `${formatCount(hist.instances)} objects of ${formatCount(hist.class_count)} classes` +
        (hist.shown < hist.class_count ? `; the ${hist.shown} with the most shallow bytes` : ""));
      show($("hprof-result"), true);
    });
  }

  function renderAllocs(body) {
    if (typeof body.enabled === "boolean") prof.tracking = body.enabled;
    const list = document.createDocumentFragment();
    const allocations = body.allocations || [];
    for (const a of allocations.slice(0, ALLOC_ROWS)) {
      const frames = a.frames || [];
      const top = frames.length ? frameText(frames[0]) : "(no Java frames)";
      list.appendChild(cellRow([
        ["num", formatCount(a.size)],
        ["mono", javaName(a.class)],
        ["num", a.thread],
        ["mono small", top, frames.map(frameText).join("\n")],
      ]));
    }
    $("allocs-list").tBodies[0].replaceChildren(list);
    const classes = document.createDocumentFragment();
    for (const c of body.by_class || []) {
      classes.appendChild(cellRow([
        ["mono", javaName(c.class)],
        ["num", formatCount(c.count)],
        ["num", formatCount(c.bytes)],
      ]));
    }
    $("allocs-classes").tBodies[0].replaceChildren(classes);
    const any = allocations.length > 0;
    for (const id of ["allocs-list", "allocs-classes-head", "allocs-classes"]) show($(id), any);
    const shown = Math.min(allocations.length, ALLOC_ROWS);
    setText($("allocs-summary"), allocations.length
      ? `${formatCount(allocations.length)} allocations recorded, newest first` +
        (shown < allocations.length ? ` (the newest ${shown} shown)` : "") +
        ` · read ${clock(new Date())}`
      : body.enabled === false ? "Tracking is off: nothing recorded." : "Nothing recorded yet.");
    const summary = $("allocs-summary");
    summary.dataset.reads = String(Number(summary.dataset.reads || 0) + 1);
    show($("allocs-result"), true);
  }

  async function fetchAllocs(id, current) {
    const body = await apiJson(vmPath(id) + "/allocs?top=20");
    if (!current()) return;
    renderAllocs(body);
    profState("allocs", "");
  }

  function allocsSwitch(on) {
    return profAction("allocs", on ? "starting…" : "stopping…", async (id, current) => {
      const body = await apiJson(vmPath(id) + (on ? "/allocs/start" : "/allocs/stop"), { method: "POST" });
      if (!current()) return;
      prof.tracking = typeof body.enabled === "boolean" ? body.enabled : on;
      await fetchAllocs(id, current);
    });
  }

  function refreshAllocs() {
    return profAction("allocs", "reading…", fetchAllocs);
  }

  function killVm() {
    const vm = shownVm();
    if (!vm) return undefined;
    const pid = vm.pid !== null && vm.pid !== undefined ? ` (pid ${vm.pid})` : "";
    const where = vm.device ? ` on ${vm.device}` : "";
    if (!confirm(`Kill ${vmName(vm)}${pid}${where}?\n\nThe process ends at once: unsaved work ` +
      "is lost and its debuggers are disconnected.")) {
      return undefined;
    }
    return profAction("kill", "killing…", async (id, current) => {
      const body = await apiJson(vmPath(id) + "/kill", { method: "POST" });
      if (current()) {
        const status = body.status !== undefined && body.status !== null ? ` (exit status ${body.status})` : "";
        profState("kill", `killed${status}`);
      }
      queueRefresh();
    }, false); // the VM is gone: nothing to ask it
  }

  function initProfiling() {
    $("trace-start").addEventListener("click", startTrace);
    $("trace-stop").addEventListener("click", stopTrace);
    $("hprof-dump").addEventListener("click", dumpHeap);
    $("allocs-start").addEventListener("click", () => allocsSwitch(true));
    $("allocs-stop").addEventListener("click", () => allocsSwitch(false));
    $("allocs-refresh").addEventListener("click", refreshAllocs);
    $("kill").addEventListener("click", killVm);
    $("trace-link").addEventListener("click", onCaptureClick);
    $("hprof-link").addEventListener("click", onCaptureClick);
  }

  // ------------------------------------------------------------------------------ start

  async function loadVersion() {
    try {
      const health = await apiJson("/health");
      setText($("version"), health.version ? `v${health.version}` : "");
      state.currentPort = Number.isInteger(health.current_port) ? health.current_port : null;
      renderVms();
    } catch (_) {
      /* shown by the VM list refresh */
    }
  }

  function init() {
    state.token = readToken();
    $("detail-close").addEventListener("click", () => {
      closeVm();
      renderVms();
    });
    $("stack-close").addEventListener("click", closeStack);
    $("gc").addEventListener("click", causeGc);
    initProfiling();
    initLogcat();
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      state.token = $("token-input").value.trim();
      try {
        sessionStorage.setItem(TOKEN_KEY, state.token);
      } catch (_) { /* private mode */ }
      $("token-input").value = "";
      banner("");
      loadVersion();
      queueRefresh();
      if (state.shown) {
        const id = state.shown;
        state.shown = null;
        openVm(id);
      }
    });
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) {
        stopThreads();
        show($("threads-live"), false);
      } else if (state.shown) {
        startThreads();
      }
    });
    loadVersion();
    startEvents();
    setInterval(renderOrigins, 1000); // "N s ago"
    refreshVms().then(() => {
      const wanted = hashParams().get("vm");
      if (wanted && state.vms.some((vm) => vm.id === wanted)) openVm(wanted);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
