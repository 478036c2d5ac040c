// The zimage page: a form that posts generation jobs to the server, follows them to their
// end, and shows the images it made and the gallery of earlier ones. Plain ES2020, no build.
"use strict";

const KEY_STORAGE = "zimage-api-key";
const JOB_STORAGE = "zimage-job";
const POLL_MS = 300;
const POLL_FAILURES_TOLERATED = 10;
const GALLERY_PAGE = 40;
const ONLY_MASKED_PADDING = 32;
const SIZE_CLASSES = { small: 0.25, default: 1, large: 2 };
const NARROW_SCREEN = "(max-width: 819px)";

const $ = (id) => document.getElementById(id);

const page = {
  info: null,          // the server's answer to GET /ui/api/info
  job: null,           // the job this page follows: {id, prompt, sentAt, cancelling, failures}
  picture: null,       // the loaded picture: {pixels, mask, tint, dataUrl, fitWidth, fitHeight}
  references: [],      // reference pictures, in order: {name, dataUrl, width, height, fitWidth, fitHeight}
  stroke: null,        // the pointer painting the mask: {pointerId, last}
  gallery: [],         // entries of GET /ui/api/gallery, newest first
  galleryShown: 0,
  galleryUrls: [],     // blob URLs of gallery thumbnails, freed on refresh
  resultUrls: [],      // blob URLs of the last job's images
};

// ---------------------------------------------------------------------------------------------
// Talking to the server

function storedKey() {
  // Storage may be blocked (private modes); the page then works without a key.
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

function authHeaders() {
  const key = storedKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

class KeyNeeded extends Error {}

// Seeds are 64-bit; a JSON number that large loses digits in JavaScript, and a seed that
// comes back changed makes a different image. So seeds travel as digit strings in the page.
function parseKeepingSeeds(text) {
  return JSON.parse(text.replace(/("seed"\s*:\s*)(\d{16,})/g, '$1"$2"'));
}

function stringifyKeepingSeed(body) {
  return JSON.stringify(body).replace(/"seed":"(\d+)"/, '"seed":$1');
}

async function api(path, { method = "GET", json } = {}) {
  const headers = authHeaders();
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = stringifyKeepingSeed(json);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body });
  } catch {
    throw new Error("The server cannot be reached; is `zimage serve` still running?");
  }
  if (response.status === 401) {
    askForKey();
    throw new KeyNeeded(storedKey()
      ? "The server did not accept the saved API key: enter it again above."
      : "This server needs an API key: enter it above.");
  }
  let data = null;
  try {
    data = parseKeepingSeeds(await response.text());
  } catch {
    // Not JSON (a proxy's error page, say): the status line below says enough.
  }
  if (!response.ok) {
    const error = new Error(data?.error || `The server answered ${response.status} ${response.statusText}.`);
    error.status = response.status;
    throw error;
  }
  if (data === null) throw new Error(`The server's answer to ${path} could not be read.`);
  return data;
}

// Plain <img src> cannot send the key, so with a key the image comes through fetch as a blob.
async function imageUrl(url, keep) {
  if (!storedKey()) return url;
  const response = await fetch(url, { headers: authHeaders() });
  if (!response.ok) throw new Error(`The image ${url} could not be loaded (${response.status}).`);
  const blobUrl = URL.createObjectURL(await response.blob());
  keep.push(blobUrl);
  return blobUrl;
}

function freeUrls(urls) {
  urls.forEach((u) => URL.revokeObjectURL(u));
  urls.length = 0;
}

// ---------------------------------------------------------------------------------------------
// Status line and errors

function showStatus(text) {
  $("status").textContent = text;
}

function showError(error) {
  showStatus(error instanceof Error ? error.message : String(error));
}

function showProgress(fraction) {
  const bar = $("progress");
  // No value makes the bar indeterminate: the job is alive but has not said how far it is.
  if (fraction == null) bar.removeAttribute("value");
  else bar.value = Math.min(1, Math.max(0, fraction));
}

// ---------------------------------------------------------------------------------------------
// API key

function askForKey() {
  const form = $("api-key-form");
  if (!form.hidden) return;
  form.hidden = false;
  $("api-key").focus();
}

function saveKey(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  try {
    localStorage.setItem(KEY_STORAGE, key);
  } catch {
    showStatus("This browser does not let the page keep the key.");
    return;
  }
  $("api-key").value = "";
  $("api-key-form").hidden = true;
  start();
}

// ---------------------------------------------------------------------------------------------
// Models, sizes and defaults

function currentModel() {
  const name = $("model").value;
  return page.info?.models.find((m) => m.short === name) || null;
}

// The model's own token cell: sides are multiples of it.
function sizeMultiple() {
  return currentModel()?.size_multiple || page.info?.size_multiple || 16;
}

function roundToMultiple(value, multiple) {
  return Math.max(multiple, Math.round(value / multiple) * multiple);
}

function aspectRatio(aspect) {
  if (aspect === "custom") return Number($("width").value) / Number($("height").value) || 1;
  const [w, h] = aspect.split(":").map(Number);
  return w / h;
}

// The size with the model's default area scaled by the size class, in the given aspect.
function sizeFor(model, aspect, sizeClass) {
  const area = model.width * model.height * SIZE_CLASSES[sizeClass];
  const ratio = aspectRatio(aspect);
  const multiple = sizeMultiple();
  return {
    width: roundToMultiple(Math.sqrt(area * ratio), multiple),
    height: roundToMultiple(Math.sqrt(area / ratio), multiple),
  };
}

function applySizeChoice() {
  const model = currentModel();
  if (!model) return;
  const aspect = $("aspect").value;
  if (aspect !== "custom") $("aspect").querySelector('option[value="custom"]').hidden = true;
  const size = sizeFor(model, aspect, $("size-class").value);
  $("width").value = size.width;
  $("height").value = size.height;
}

// A typed or reused size shows in the two pickers when one of their choices makes it.
function matchSizeChoice() {
  const model = currentModel();
  const width = Number($("width").value);
  const height = Number($("height").value);
  const custom = $("aspect").querySelector('option[value="custom"]');
  if (model) {
    for (const aspect of aspectChoices()) {
      for (const sizeClass of Object.keys(SIZE_CLASSES)) {
        const size = sizeFor(model, aspect, sizeClass);
        if (size.width === width && size.height === height) {
          $("aspect").value = aspect;
          $("size-class").value = sizeClass;
          custom.hidden = true;
          return;
        }
      }
    }
  }
  custom.hidden = false;
  $("aspect").value = "custom";
}

function aspectChoices() {
  return [...$("aspect").options].map((o) => o.value).filter((v) => v !== "custom");
}

function setSize(width, height) {
  $("width").value = width;
  $("height").value = height;
  matchSizeChoice();
}

function applyModelDefaults() {
  const model = currentModel();
  if (!model) return;
  $("steps").value = model.steps;
  $("guidance").value = model.guidance;
  $("negative").value = model.negative_prompt || "";
  $("cfg-normalization").checked = Boolean(model.cfg_normalization);
  $("cfg-truncation").value = model.cfg_truncation ?? 1;
  showFamilyOptions(model);
  const given = givenPicture();
  if (given) setSize(given.fitWidth, given.fitHeight);
  else applySizeChoice();
  updateNegativeRow();
}

// What the model's family takes, as the server says; a model that says nothing takes all but
// references (the first family's rule).
function takes(model, option) {
  return model?.takes?.[option] ?? option !== "references";
}

// The form offers what the chosen model's family has.
function showFamilyOptions(model) {
  $("reference-section").hidden = !takes(model, "references");
  $("control-section").hidden = !takes(model, "controlnet");
  $("cfg-normalization-row").hidden = !takes(model, "cfg_normalization");
  $("cfg-truncation-row").hidden = !takes(model, "cfg_truncation");
  $("picture-section").hidden = !takes(model, "picture");
  $("hires-rows").hidden = !takes(model, "hires");
}

// The picture whose size the output takes when the job names none: the input picture, else
// (for a model that edits from references) the first reference.
function givenPicture() {
  if (page.picture && takes(currentModel(), "picture")) return page.picture;
  return takes(currentModel(), "references") ? page.references[0] || null : null;
}

// A negative prompt only acts with classifier-free guidance, that is guidance above 1.
function updateNegativeRow() {
  $("negative-row").hidden = !(Number($("guidance").value) > 1);
}

function setSizeStep(multiple) {
  for (const id of ["width", "height"]) {
    $(id).min = multiple;
    $(id).step = multiple;
  }
}

// ---------------------------------------------------------------------------------------------
// Filling the pickers from the server's info

function option(value, text) {
  const element = document.createElement("option");
  element.value = value;
  element.textContent = text;
  return element;
}

function fillModels(info) {
  const select = $("model");
  select.replaceChildren(...info.models.map((m) => {
    const element = option(m.short, m.short);
    element.title = m.name;
    return element;
  }));
  if (info.current && info.models.some((m) => m.short === info.current)) select.value = info.current;
}

function fillLoras(loras) {
  const fieldset = $("loras");
  fieldset.querySelectorAll(".lora").forEach((row) => row.remove());
  $("loras-empty").hidden = loras.length > 0;
  loras.forEach((path, n) => fieldset.append(loraRow(path, n)));
}

function loraRow(path, n) {
  const row = document.createElement("div");
  row.className = "lora";
  row.innerHTML = `
    <input type="checkbox" class="lora-use" id="lora-use-${n}">
    <label for="lora-use-${n}" class="lora-name"></label>
    <label for="lora-scale-${n}" class="visually-hidden">Scale</label>
    <input type="number" class="lora-scale" id="lora-scale-${n}" step="0.05" value="1" inputmode="decimal">`;
  row.querySelector(".lora-use").value = path;
  row.querySelector(".lora-name").textContent = path;
  row.querySelector(".visually-hidden").textContent = `Scale of ${path}`;
  return row;
}

function fillControlNets(controlnets) {
  const none = controlnets.length === 0;
  $("controlnet").replaceChildren(option("none", "none"), ...controlnets.map((c) => option(c, c)));
  $("control-none").hidden = !none;
  for (const id of ["controlnet", "control-image", "control-scale"]) $(id).disabled = none;
}

// ---------------------------------------------------------------------------------------------
// Picture and mask

function loadImageFile(file) {
  return new Promise((resolve, reject) => {
    const url = URL.createObjectURL(file);
    const image = new Image();
    image.onload = () => {
      URL.revokeObjectURL(url);
      resolve(image);
    };
    image.onerror = () => {
      URL.revokeObjectURL(url);
      reject(new Error(`${file.name} is not a picture this browser can read.`));
    };
    image.src = url;
  });
}

function blankCanvas(width, height) {
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  return canvas;
}

// A loaded picture's pixels, re-encoded as PNG so the server gets exactly the pixels (and
// orientation) shown here, and the size the server makes of it: each side down to the size
// multiple.
function pictureOf(image) {
  const { naturalWidth: width, naturalHeight: height } = image;
  const pixels = blankCanvas(width, height);
  pixels.getContext("2d").drawImage(image, 0, 0);
  const multiple = sizeMultiple();
  return {
    pixels,
    width,
    height,
    dataUrl: pixels.toDataURL("image/png"),
    fitWidth: Math.max(multiple, Math.floor(width / multiple) * multiple),
    fitHeight: Math.max(multiple, Math.floor(height / multiple) * multiple),
  };
}

async function pictureChosen() {
  const file = $("picture").files[0];
  if (!file) {
    clearPicture();
    return;
  }
  let image;
  try {
    image = await loadImageFile(file);
  } catch (error) {
    clearPicture();
    showError(error);
    return;
  }
  const { naturalWidth: width, naturalHeight: height } = image;
  page.picture = {
    ...pictureOf(image),
    mask: blankCanvas(width, height),   // painted = opaque white, the rest transparent
    tint: blankCanvas(width, height),   // the mask in the overlay colour, for showing it
  };
  const view = $("mask-canvas");
  view.width = width;
  view.height = height;
  $("mask-editor").hidden = false;
  setSize(page.picture.fitWidth, page.picture.fitHeight);
  renderMask();
  showStatus(`Picture ${file.name}: ${width}×${height}.`);
}

function clearPicture() {
  $("picture").value = "";
  page.picture = null;
  $("mask-editor").hidden = true;
  sizeFromPictures();
}

// The size after the pictures changed: the given picture's, else the model's in the chosen
// aspect.
function sizeFromPictures() {
  const given = givenPicture();
  if (given) {
    setSize(given.fitWidth, given.fitHeight);
    return;
  }
  $("aspect").querySelector('option[value="custom"]').hidden = true;
  if ($("aspect").value === "custom") $("aspect").value = "1:1";
  applySizeChoice();
}

// ---------------------------------------------------------------------------------------------
// Reference pictures (a model that edits from them)

function maxReferences() {
  return page.info?.max_references || 4;
}

async function referenceChosen() {
  const input = $("reference-add");
  const file = input.files[0];
  input.value = "";
  if (!file) return;
  if (page.references.length >= maxReferences()) {
    showError(new Error(`The model takes at most ${maxReferences()} references; remove one first.`));
    return;
  }
  let image;
  try {
    image = await loadImageFile(file);
  } catch (error) {
    showError(error);
    return;
  }
  const { pixels, ...reference } = pictureOf(image);
  page.references.push({ name: file.name, ...reference });
  showReferences();
  if (page.references.length === 1 && !page.picture) sizeFromPictures();
  showStatus(`Reference ${page.references.length}, ${file.name}: ${reference.width}×${reference.height}.`);
}

function removeReference(index) {
  page.references.splice(index, 1);
  showReferences();
  if (index === 0 && !page.picture) sizeFromPictures();
}

function showReferences() {
  const list = $("references");
  list.replaceChildren(...page.references.map((reference, index) => {
    const item = document.createElement("li");
    item.className = "reference";
    const thumb = document.createElement("img");
    thumb.src = reference.dataUrl;
    thumb.alt = `Reference ${index + 1}`;
    const name = document.createElement("span");
    name.textContent = `${reference.name}, ${reference.width}×${reference.height}`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "quiet reference-remove";
    remove.textContent = "Remove";
    remove.setAttribute("aria-label", `Remove reference ${index + 1}, ${reference.name}`);
    remove.addEventListener("click", () => removeReference(index));
    item.append(thumb, name, remove);
    return item;
  }));
  $("reference-add").disabled = page.references.length >= maxReferences();
}

let renderQueued = false;

// Painting moves faster than the screen redraws: draw at most once a frame.
function renderMask() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    drawMaskView();
  });
}

function drawMaskView() {
  const picture = page.picture;
  if (!picture) return;
  const tint = picture.tint.getContext("2d");
  tint.globalCompositeOperation = "source-over";
  tint.clearRect(0, 0, picture.tint.width, picture.tint.height);
  tint.drawImage(picture.mask, 0, 0);
  tint.globalCompositeOperation = "source-in";
  tint.fillStyle = getComputedStyle(document.body).getPropertyValue("--mask").trim() || "#ff3b6b";
  tint.fillRect(0, 0, picture.tint.width, picture.tint.height);

  const view = $("mask-canvas").getContext("2d");
  view.clearRect(0, 0, picture.pixels.width, picture.pixels.height);
  view.drawImage(picture.pixels, 0, 0);
  view.globalAlpha = 0.5;
  view.drawImage(picture.tint, 0, 0);
  view.globalAlpha = 1;
}

// The canvas is scaled (and letterboxed by object-fit) on screen; paint in picture pixels.
function picturePoint(event) {
  const view = $("mask-canvas");
  const box = view.getBoundingClientRect();
  const scale = Math.min(box.width / view.width, box.height / view.height);
  const left = box.left + (box.width - view.width * scale) / 2;
  const top = box.top + (box.height - view.height * scale) / 2;
  return { x: (event.clientX - left) / scale, y: (event.clientY - top) / scale };
}

function maskPen() {
  const context = page.picture.mask.getContext("2d");
  context.globalCompositeOperation = $("mask-erase").checked ? "destination-out" : "source-over";
  context.fillStyle = context.strokeStyle = "#fff";
  context.lineWidth = Number($("brush-size").value);
  context.lineCap = context.lineJoin = "round";
  return context;
}

function paintDot(point) {
  const pen = maskPen();
  pen.beginPath();
  pen.arc(point.x, point.y, pen.lineWidth / 2, 0, 2 * Math.PI);
  pen.fill();
}

function paintLine(from, to) {
  const pen = maskPen();
  pen.beginPath();
  pen.moveTo(from.x, from.y);
  pen.lineTo(to.x, to.y);
  pen.stroke();
}

function strokeStart(event) {
  if (!page.picture || page.stroke || event.button > 0) return;
  event.preventDefault();
  $("mask-canvas").setPointerCapture(event.pointerId);
  const point = picturePoint(event);
  page.stroke = { pointerId: event.pointerId, last: point };
  paintDot(point);
  renderMask();
}

function strokeMove(event) {
  const stroke = page.stroke;
  if (!stroke || stroke.pointerId !== event.pointerId) return;
  const point = picturePoint(event);
  paintLine(stroke.last, point);
  stroke.last = point;
  renderMask();
}

function strokeEnd(event) {
  if (page.stroke?.pointerId === event.pointerId) page.stroke = null;
}

function changeMask(change) {
  if (!page.picture) return;
  const { mask } = page.picture;
  const context = mask.getContext("2d");
  const pixels = context.getImageData(0, 0, mask.width, mask.height);
  change(pixels.data);
  context.putImageData(pixels, 0, 0);
  renderMask();
}

function fillMask() {
  changeMask((data) => {
    for (let i = 0; i < data.length; i += 4) data.set([255, 255, 255, 255], i);
  });
}

function invertMask() {
  changeMask((data) => {
    for (let i = 0; i < data.length; i += 4) data.set([255, 255, 255, 255 - data[i + 3]], i);
  });
}

function clearMask() {
  changeMask((data) => data.fill(0));
}

function maskIsEmpty(mask) {
  const data = mask.getContext("2d").getImageData(0, 0, mask.width, mask.height).data;
  for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return false;
  return true;
}

// The server reads the mask as grey levels: white repaints, black keeps.
function maskPng(mask) {
  const out = blankCanvas(mask.width, mask.height);
  const context = out.getContext("2d");
  context.fillStyle = "#000";
  context.fillRect(0, 0, out.width, out.height);
  context.drawImage(mask, 0, 0);
  return out.toDataURL("image/png");
}

function fileAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`${file.name} could not be read.`));
    reader.readAsDataURL(file);
  });
}

// ---------------------------------------------------------------------------------------------
// The job request

function numberOf(id) {
  return Number($(id).value);
}

function chosenLoras() {
  return [...document.querySelectorAll(".lora-use:checked")].map((box) => ({
    path: box.value,
    scale: Number(box.closest(".lora").querySelector(".lora-scale").value || 1),
  }));
}

async function buildJob() {
  const guidance = numberOf("guidance");
  const job = {
    model: $("model").value,
    prompt: $("prompt").value,
    steps: numberOf("steps"),
    guidance,
    count: numberOf("count"),
    width: numberOf("width"),
    height: numberOf("height"),
  };
  if (guidance > 1) job.negative_prompt = $("negative").value;
  const model = currentModel();
  addGuidanceOptions(job, model);
  if (takes(model, "hires")) addHires(job);
  if (!$("random-seed").checked && $("seed").value !== "") job.seed = $("seed").value;
  const loras = chosenLoras();
  if (loras.length) job.loras = loras;
  if (page.picture && takes(model, "picture")) addPicture(job, page.picture, takes(model, "mask"));
  if (takes(model, "references") && page.references.length) {
    job.references = page.references.map((r) => r.dataUrl);
  }
  keepGivenSize(job);
  if (takes(model, "controlnet") && $("controlnet").value !== "none") await addControl(job);
  return job;
}

// Without a size the server keeps the given picture's own; send one only when the user chose
// another.
function keepGivenSize(job) {
  const given = givenPicture();
  if (given && job.width === given.fitWidth && job.height === given.fitHeight) {
    delete job.width;
    delete job.height;
  }
}

// Sent only where they differ from the model's defaults, so a model's own settings rule.
function addGuidanceOptions(job, model) {
  const normalization = $("cfg-normalization").checked;
  if (takes(model, "cfg_normalization") && normalization !== Boolean(model?.cfg_normalization)) {
    job.cfg_normalization = normalization;
  }
  const truncation = numberOf("cfg-truncation");
  if (takes(model, "cfg_truncation") && truncation !== (model?.cfg_truncation ?? 1)) {
    job.cfg_truncation = truncation;
  }
}

function addHires(job) {
  const scale = numberOf("hires-scale");
  if (!(scale > 1)) return;
  job.hires_scale = scale;
  job.hires_strength = numberOf("hires-strength");
  if ($("hires-steps").value !== "") job.hires_steps = numberOf("hires-steps");
}

function addPicture(job, picture, masks) {
  job.picture = picture.dataUrl;
  job.strength = numberOf("strength");
  if (masks && !maskIsEmpty(picture.mask)) {
    job.mask = maskPng(picture.mask);
    // The area around the mask, made at the full size and pasted back (A1111's "only masked").
    if ($("only-masked").checked) job.only_masked = ONLY_MASKED_PADDING;
  }
}

async function addControl(job) {
  const file = $("control-image").files[0];
  if (!file) throw new Error("A ControlNet needs a control image: choose one, or set ControlNet to none.");
  job.controlnet = $("controlnet").value;
  job.control_image = await fileAsDataUrl(file);
  job.control_scale = numberOf("control-scale");
}

// The form skips the browser's own check (novalidate) because a reused value such as
// guidance 3.25 is off the arrows' step yet fine for the server; every other problem counts.
function validateForm() {
  $("strength").setCustomValidity(page.picture && numberOf("strength") <= 0 ? "Strength must be above 0." : "");
  for (const element of $("job-form").elements) {
    if (!element.willValidate || element.closest("[hidden]") || !inUse(element)) continue;
    const v = element.validity;
    if (v.valid) continue;
    const onlyOffStep = v.stepMismatch && !v.valueMissing && !v.rangeOverflow
      && !v.rangeUnderflow && !v.badInput && !v.customError;
    if (onlyOffStep && element.id !== "width" && element.id !== "height") continue;
    const section = element.closest("details");
    if (section) section.open = true;
    element.focus();
    element.reportValidity();
    return false;
  }
  return true;
}

function inUse(element) {
  if (element.id === "strength") return page.picture !== null;
  if (element.closest("#control-section")) return $("controlnet").value !== "none";
  if (element.classList.contains("lora-scale")) return element.closest(".lora").querySelector(".lora-use").checked;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Running a job

async function generate() {
  if (page.job || !validateForm()) return;
  let job;
  try {
    job = await buildJob();
  } catch (error) {
    showError(error);
    return;
  }
  $("generate").disabled = true;
  showProgress(null);
  showStatus("sending…");
  try {
    const { id } = await api("/ui/api/jobs", { method: "POST", json: job });
    follow(id, job.prompt);
  } catch (error) {
    $("generate").disabled = false;
    showProgress(0);
    showError(error);
    return;
  }
  if (window.matchMedia(NARROW_SCREEN).matches) $("output").scrollIntoView({ behavior: "smooth" });
}

function follow(id, prompt, resumed = false) {
  page.job = { id, prompt, resumed, sentAt: performance.now(), cancelling: false, failures: 0 };
  rememberJob(page.job);
  $("generate").disabled = true;
  $("cancel").disabled = false;
  poll();
}

// The job runs on whether or not the page stays open; a reload picks it up again.
function rememberJob(job) {
  try {
    if (job) sessionStorage.setItem(JOB_STORAGE, JSON.stringify({ id: job.id, prompt: job.prompt }));
    else sessionStorage.removeItem(JOB_STORAGE);
  } catch {
    // Without storage a reload only loses sight of the job; the gallery still gets its images.
  }
}

function resumeJob() {
  let saved = null;
  try {
    saved = JSON.parse(sessionStorage.getItem(JOB_STORAGE));
  } catch {
    return;
  }
  if (saved?.id) follow(saved.id, saved.prompt || "", true);
}

async function poll() {
  const job = page.job;
  if (!job) return;
  let status;
  try {
    status = await api(`/ui/api/jobs/${encodeURIComponent(job.id)}`);
  } catch (error) {
    job.failures += 1;
    if (error.status === 404 && job.resumed) {
      // The server restarted or forgot the job since the page last saw it; nothing to show.
      endJob();
      showStatus("Ready.");
    } else if (error instanceof KeyNeeded || error.status === 404 || job.failures > POLL_FAILURES_TOLERATED) {
      endJob();
      showError(error);
    } else {
      showStatus(`${error.message} Trying again…`);
      setTimeout(poll, POLL_MS * 4);
    }
    return;
  }
  job.failures = 0;
  if (page.job !== job) return;
  showJob(job, status);
  if (status.state === "queued" || status.state === "running") setTimeout(poll, POLL_MS);
}

function showJob(job, status) {
  switch (status.state) {
    case "queued":
      showProgress(null);
      if (!job.cancelling) showStatus(status.position > 0 ? `queued (${status.position} ahead)` : "queued");
      break;
    case "running":
      // Between images the last picture stays until the next image's first step.
      if (status.preview) showPreview(status.preview);
      showProgress(status.progress ? status.progress.fraction : null);
      if (!job.cancelling) showStatus(status.progress ? progressText(status.progress) : "running");
      break;
    case "done":
      showProgress(1);
      showStatus(`done in ${secondsTaken(job, status).toFixed(1)} s`);
      jobDone(job, status.images || []);
      break;
    case "cancelled":
      showProgress(0);
      showStatus(cancelledText(status.error));
      // A batch cancelled after some images keeps them: show them as a finished job's.
      if (status.images && status.images.length > 0) jobDone(job, status.images);
      else endJob();
      break;
    default:
      showProgress(0);
      showStatus(status.error || "The job failed without saying why.");
      endJob();
  }
}

// The latest step's picture while the job runs; the finished images replace it.
function showPreview(dataUrl) {
  const img = $("preview");
  if (dataUrl) {
    if (img.getAttribute("src") !== dataUrl) img.src = dataUrl;
    img.hidden = false;
  } else {
    img.hidden = true;
    img.removeAttribute("src");
  }
}

function progressText(p) {
  const parts = [];
  if (p.images > 1) parts.push(`image ${p.image} of ${p.images}`);
  if (p.steps > 0) parts.push(`step ${p.step} of ${p.steps}`);
  return parts.length ? `${p.phase}: ${parts.join(", ")}` : `${p.phase}…`;
}

function secondsTaken(job, status) {
  return status.progress?.elapsed ?? (performance.now() - job.sentAt) / 1000;
}

function cancelledText(error) {
  if (!error) return "cancelled";
  return /cancel/i.test(error) ? error.charAt(0).toUpperCase() + error.slice(1) : `cancelled: ${error}`;
}

function jobDone(job, images) {
  endJob();
  showResults(images, job.prompt);
  const seed = images[0]?.settings?.seed;
  // Kept in the form so that unchecking "random" repeats this image.
  if (seed != null) $("seed").value = String(seed);
  refreshGallery().catch(showError);
}

function endJob() {
  page.job = null;
  showPreview(null);
  rememberJob(null);
  const hadFocus = document.activeElement;
  $("cancel").disabled = true;
  $("generate").disabled = false;
  // A disabled button drops the keyboard focus to the page; give it back to Generate.
  if (hadFocus === $("cancel") || hadFocus === document.body || hadFocus === null) $("generate").focus();
}

async function cancelJob() {
  const job = page.job;
  if (!job || job.cancelling) return;
  job.cancelling = true;
  $("cancel").disabled = true;
  showStatus("stopping…");
  try {
    await api(`/ui/api/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" });
  } catch (error) {
    job.cancelling = false;
    $("cancel").disabled = false;
    showError(error);
  }
}

async function showResults(images, prompt) {
  freeUrls(page.resultUrls);
  const results = $("results");
  results.replaceChildren();
  for (const entry of images) {
    const link = document.createElement("a");
    const image = document.createElement("img");
    image.alt = prompt;
    image.width = entry.width;
    image.height = entry.height;
    link.target = "_blank";
    link.rel = "noopener";
    link.append(image);
    results.append(link);
    try {
      link.href = image.src = await imageUrl(entry.url, page.resultUrls);
    } catch (error) {
      showError(error);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gallery

async function refreshGallery() {
  const { images } = await api("/ui/api/gallery");
  page.gallery = images;
  page.galleryShown = 0;
  freeUrls(page.galleryUrls);
  $("gallery").replaceChildren();
  showMoreGallery();
}

function showMoreGallery() {
  const gallery = $("gallery");
  const next = page.gallery.slice(page.galleryShown, page.galleryShown + GALLERY_PAGE);
  next.forEach((entry) => gallery.append(galleryItem(entry)));
  page.galleryShown += next.length;
  $("gallery-more").hidden = page.galleryShown >= page.gallery.length;
  if (page.gallery.length === 0) showEmptyGallery();
}

function showEmptyGallery() {
  const empty = document.createElement("p");
  empty.className = "note";
  empty.textContent = "No images yet.";
  $("gallery").replaceChildren(empty);
}

function galleryItem(entry) {
  const settings = entry.settings || {};
  const figure = document.createElement("figure");
  figure.className = "gallery-item";
  figure.dataset.file = entry.file;
  figure.innerHTML = `
    <a target="_blank" rel="noopener"><img loading="lazy"></a>
    <figcaption><p class="caption-prompt"></p><p class="caption-meta"></p></figcaption>
    <div class="item-actions">
      <button type="button" class="reuse">Reuse settings</button>
      <button type="button" class="delete">×</button>
    </div>`;
  const link = figure.querySelector("a");
  const image = figure.querySelector("img");
  image.alt = settings.prompt || entry.file;
  image.width = entry.width;
  image.height = entry.height;
  imageUrl(entry.url, page.galleryUrls)
    .then((url) => { link.href = image.src = url; })
    .catch(showError);
  figure.querySelector(".caption-prompt").textContent = settings.prompt || entry.file;
  figure.querySelector(".caption-meta").textContent = captionMeta(entry, settings);
  figure.querySelector(".reuse").addEventListener("click", () => reuseSettings(entry));
  const remove = figure.querySelector(".delete");
  remove.setAttribute("aria-label", `Delete ${entry.file}`);
  remove.title = "Delete";
  remove.addEventListener("click", () => deleteImage(entry, figure));
  return figure;
}

function captionMeta(entry, settings) {
  const parts = [];
  if (settings.seed != null) parts.push(`seed ${settings.seed}`);
  parts.push(`${entry.width}×${entry.height}`);
  if (settings.model) parts.push(settings.model);
  return parts.join(" · ");
}

async function deleteImage(entry, figure) {
  if (!window.confirm(`Delete ${entry.file} from the gallery?`)) return;
  try {
    await api(`/ui/api/gallery/${encodeURIComponent(entry.file)}`, { method: "DELETE" });
  } catch (error) {
    showError(error);
    return;
  }
  page.gallery = page.gallery.filter((e) => e !== entry);
  page.galleryShown -= 1;
  // Focus would fall to the page; keep it in the gallery for keyboard users.
  const neighbour = figure.nextElementSibling || figure.previousElementSibling;
  figure.remove();
  neighbour?.querySelector(".reuse")?.focus();
  if (page.gallery.length === 0) showEmptyGallery();
  showStatus(`Deleted ${entry.file}.`);
}

// Fills the form from a gallery image, without the model's defaults overriding it:
// setting a value from script fires no change event, so applyModelDefaults stays out.
function reuseSettings(entry) {
  const s = entry.settings || {};
  const models = page.info?.models || [];
  if (s.model && models.some((m) => m.short === s.model)) $("model").value = s.model;
  showFamilyOptions(currentModel());
  $("prompt").value = s.prompt ?? "";
  $("negative").value = s.negative_prompt ?? "";
  if (s.width && s.height) setSize(s.width, s.height);
  if (s.steps != null) $("steps").value = s.steps;
  if (s.guidance != null) $("guidance").value = s.guidance;
  if (s.seed != null) {
    $("seed").value = String(s.seed);
    $("random-seed").checked = false;
  }
  $("count").value = 1;
  if (s.strength != null) $("strength").value = s.strength;
  $("only-masked").checked = s.only_masked != null;
  if (s.cfg_normalization != null) $("cfg-normalization").checked = Boolean(s.cfg_normalization);
  if (s.cfg_truncation != null) $("cfg-truncation").value = s.cfg_truncation;
  reuseHires(s.hires);
  reuseLoras(s.loras || []);
  reuseControl(s);
  updateNegativeRow();
  showStatus(`The settings of ${entry.file} are in the form.`);
  $("prompt").focus();
}

function reuseHires(hires) {
  $("hires-scale").value = hires?.scale ?? 1;
  if (hires?.strength != null) $("hires-strength").value = hires.strength;
  $("hires-steps").value = hires?.steps ?? "";
}

function reuseLoras(loras) {
  for (const box of document.querySelectorAll(".lora-use")) {
    const used = loras.find((l) => l.path === box.value);
    box.checked = Boolean(used);
    if (used && used.scale != null) box.closest(".lora").querySelector(".lora-scale").value = used.scale;
  }
}

function reuseControl(s) {
  const known = [...$("controlnet").options].some((o) => o.value === s.controlnet);
  $("controlnet").value = s.controlnet && known ? s.controlnet : "none";
  if (s.control_scale != null) $("control-scale").value = s.control_scale;
}

// ---------------------------------------------------------------------------------------------
// Keyboard: Ctrl/Cmd+Enter anywhere generates, Escape cancels the running job.

function onKey(event) {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    if (event.target.closest?.("#api-key-form")) return;
    event.preventDefault();
    $("job-form").requestSubmit();
  } else if (event.key === "Escape" && page.job) {
    event.preventDefault();
    cancelJob();
  }
}

// ---------------------------------------------------------------------------------------------
// Start

function wireUp() {
  $("job-form").addEventListener("submit", (event) => {
    event.preventDefault();
    generate();
  });
  $("api-key-form").addEventListener("submit", saveKey);
  $("cancel").addEventListener("click", cancelJob);
  document.addEventListener("keydown", onKey);

  $("model").addEventListener("change", applyModelDefaults);
  $("aspect").addEventListener("change", applySizeChoice);
  $("size-class").addEventListener("change", applySizeChoice);
  $("width").addEventListener("change", matchSizeChoice);
  $("height").addEventListener("change", matchSizeChoice);
  $("guidance").addEventListener("input", updateNegativeRow);
  // Typing a seed means wanting that seed.
  $("seed").addEventListener("input", () => { $("random-seed").checked = false; });

  $("picture").addEventListener("change", pictureChosen);
  $("picture-clear").addEventListener("click", clearPicture);
  $("reference-add").addEventListener("change", referenceChosen);
  const view = $("mask-canvas");
  view.addEventListener("pointerdown", strokeStart);
  view.addEventListener("pointermove", strokeMove);
  view.addEventListener("pointerup", strokeEnd);
  view.addEventListener("pointercancel", strokeEnd);
  $("brush-size").addEventListener("input", () => { $("brush-size-value").textContent = $("brush-size").value; });
  $("mask-fill").addEventListener("click", fillMask);
  $("mask-invert").addEventListener("click", invertMask);
  $("mask-clear").addEventListener("click", clearMask);

  $("gallery-more").addEventListener("click", showMoreGallery);

  document.querySelectorAll(".pull-choice").forEach((button) => {
    button.addEventListener("click", () => pullModel(button.dataset.model));
  });
  $("pull-form").addEventListener("submit", (event) => {
    event.preventDefault();
    pullModel($("pull-name").value);
  });
}

async function loadInfo() {
  const info = await api("/ui/api/info");
  page.info = info;
  fillModels(info);
  fillLoras(info.loras || []);
  fillControlNets(info.controlnets || []);
  $("count").max = info.max_count;
  $("reference-max").textContent = maxReferences();
  setSizeStep(sizeMultiple());
  applyModelDefaults();
  $("generate").disabled = info.models.length === 0;
  if (info.models.length === 0) {
    $("pull-card").hidden = false;
    throw new Error("No model is stored yet: pull one above, or import one with zimage.");
  }
}

// Pulling a model (offered when the store has none), with /api/pull's progress

// Reads /api/pull's NDJSON lines as they come, handing each to `onLine`.
async function streamPull(name, onLine) {
  let response;
  try {
    response = await fetch("/api/pull", {
      method: "POST",
      headers: { ...authHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify({ model: name }),
    });
  } catch {
    throw new Error("The server cannot be reached; is `zimage serve` still running?");
  }
  if (!response.ok) {
    const data = await response.json().catch(() => null);
    throw new Error(data?.error || `The server answered ${response.status} ${response.statusText}.`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, end).trim();
      buffered = buffered.slice(end + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
}

async function pullModel(name) {
  // The store names `huggingface.co/…` pulls `hf.co/…`.
  name = name.trim().replace(/^huggingface\.co\//, "hf.co/");
  const card = $("pull-card");
  const buttons = card.querySelectorAll("button");
  const bar = $("pull-progress");
  const say = (text) => { $("pull-status").textContent = text; };
  buttons.forEach((b) => { b.disabled = true; });
  bar.hidden = false;
  bar.removeAttribute("value");
  say(`Pulling ${name}…`);
  const files = new Map();
  let ended = false;
  try {
    await streamPull(name, (line) => {
      if (line.error) throw new Error(line.error);
      if (line.status === "success") ended = true;
      if (line.status === "importing" && line.total) {
        bar.value = line.completed / line.total;
        say(`Importing ${name} into the store…`);
      } else if (line.digest && line.total) {
        files.set(line.digest, line);
        const [done, total] = [...files.values()].reduce(
          ([d, t], f) => [d + f.completed, t + f.total], [0, 0]);
        bar.value = total ? done / total : 0;
        say(`Downloading ${name}: ${files.size} files, ${Math.round(100 * bar.value)}%`);
      }
    });
    if (!ended) throw new Error(`The pull of ${name} ended early; pull it again to resume.`);
    await loadInfo();
    $("model").value = name;
    applyModelDefaults();
    card.hidden = true;
    showStatus(`Pulled ${name}. Ready.`);
  } catch (error) {
    bar.hidden = true;
    say(error.message);
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

async function start() {
  showStatus("Loading…");
  const [info, gallery] = await Promise.allSettled([loadInfo(), refreshGallery()]);
  const failed = [info, gallery].find((r) => r.status === "rejected");
  showStatus(failed ? failed.reason.message : "Ready.");
  if (failed) return;
  // A reload may bring back the chosen file without telling the page.
  if ($("picture").files.length) await pictureChosen();
  if (!page.job) resumeJob();
}

wireUp();
start();
