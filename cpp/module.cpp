// llama_extrapolate._core: a thin binding of the llama-extrapolate C API.
//
// The logic lives in the Python package; this module only converts between
// the C API and Python objects. It links against the patched libllama, which
// llama_extrapolate loads (through llama_cpp) before importing this module, so
// both share one loaded copy of the library.

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <llama-extrapolate.h>
#include <ggml-backend.h>
#include <ggml-rpc.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <windows.h>
#else
#include <dlfcn.h>
#endif

namespace py = pybind11;

namespace {

std::vector<std::string> split_list(const char * text) {
    std::vector<std::string> out;
    std::string item;
    for (const char * c = text; c && *c; ++c) {
        if (*c == ';') {
            if (!item.empty()) out.push_back(item);
            item.clear();
        } else {
            item.push_back(*c);
        }
    }
    if (!item.empty()) out.push_back(item);
    return out;
}

// path of the shared object that defines the C API, as the loader resolved it
std::string library_path() {
#if defined(_WIN32)
    HMODULE handle = nullptr;
    if (!GetModuleHandleExA(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                            reinterpret_cast<LPCSTR>(&llama_ext_api_version), &handle)) {
        throw std::runtime_error("GetModuleHandleExA failed for llama_ext_api_version");
    }
    char buf[MAX_PATH];
    DWORD n = GetModuleFileNameA(handle, buf, MAX_PATH);
    return std::string(buf, n);
#else
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&llama_ext_api_version), &info) == 0 || info.dli_fname == nullptr) {
        throw std::runtime_error("dladdr failed for llama_ext_api_version");
    }
    return info.dli_fname;
#endif
}

const llama_context * context_from_address(std::uintptr_t address) {
    if (address == 0) {
        throw py::value_error("context address is 0 (NULL): pass the address of a live llama_context, "
                              "e.g. llama_extrapolate.context_address(llm)");
    }
    return reinterpret_cast<const llama_context *>(address);
}

py::dict context_info(std::uintptr_t address) {
    llama_ext_context_info info{};
    if (llama_ext_context_get_info(context_from_address(address), &info) != 0) {
        throw std::runtime_error("llama_ext_context_get_info failed");
    }
    py::dict d;
    d["n_ctx"]            = info.n_ctx;
    d["n_batch"]          = info.n_batch;
    d["n_ubatch"]         = info.n_ubatch;
    d["n_seq_max"]        = info.n_seq_max;
    d["n_ctx_train"]      = info.n_ctx_train;
    d["n_layer"]          = info.n_layer;
    d["n_head"]           = info.n_head;
    d["n_head_kv"]        = info.n_head_kv;
    d["rope_type"]        = info.rope_type;
    d["f_max_alibi_bias"] = info.f_max_alibi_bias;
    return d;
}

llama_context * mutable_context_from_address(std::uintptr_t address) {
    return const_cast<llama_context *>(context_from_address(address));
}

const char * status_text(int32_t status) {
    switch (status) {
        case LLAMA_EXT_ERR_NULL:        return "a required pointer is NULL";
        case LLAMA_EXT_ERR_COUNT:       return "wrong number of values";
        case LLAMA_EXT_ERR_VALUE:       return "a value is out of range";
        case LLAMA_EXT_ERR_UNSUPPORTED: return "not supported for this model or context";
        default:                        return "unknown error";
    }
}

void check_status(int32_t status, const char * what) {
    if (status != LLAMA_EXT_OK) {
        throw py::value_error(std::string(what) + ": " + status_text(status) + " (status " + std::to_string(status) + ")");
    }
}

py::dict model_attention(std::uintptr_t model_address) {
    if (model_address == 0) {
        throw py::value_error("model address is 0 (NULL): pass the address of a loaded llama_model");
    }
    llama_ext_attention_params p{};
    check_status(llama_ext_model_get_attention(reinterpret_cast<const llama_model *>(model_address), &p),
                 "llama_ext_model_get_attention");
    py::dict d;
    d["n_sink"]                 = p.n_sink;
    d["n_window"]               = p.n_window;
    d["n_ceiling"]              = p.n_ceiling;
    d["n_rollback"]             = p.n_rollback;
    d["temperature"]            = p.temperature;
    d["temperature_log_length"] = p.temperature_log_length;
    d["n_top_k"]                = p.n_top_k;
    d["n_top_k_layer"]          = p.n_top_k_layer;
    d["n_top_k_distance"]       = p.n_top_k_distance;
    d["n_memory_blocks"]        = p.n_memory_blocks;
    d["n_memory_block_size"]    = p.n_memory_block_size;
    d["n_memory_candidates"]    = p.n_memory_candidates;
    d["memory_per_layer"]       = p.memory_per_layer;
    return d;
}

// a loaded llama_model at an address from Python, and its number of layers
std::pair<const llama_model *, int32_t> model_from_address(std::uintptr_t model_address) {
    if (model_address == 0) {
        throw py::value_error("model address is 0 (NULL): pass the address of a loaded llama_model");
    }
    const auto * model = reinterpret_cast<const llama_model *>(model_address);
    const int32_t n_layer = llama_ext_model_get_layers(model, nullptr, nullptr, SIZE_MAX);
    if (n_layer < 0) {
        throw py::value_error("llama_ext_model_get_layers failed");
    }
    return {model, n_layer};
}

py::dict model_layers(std::uintptr_t model_address) {
    const auto [model, n_layer] = model_from_address(model_address);
    std::vector<uint8_t> rope(n_layer), swa(n_layer), recurrent(n_layer);
    llama_ext_model_get_layers(model, rope.data(), swa.data(), rope.size());
    llama_ext_model_get_recurrent_layers(model, recurrent.data(), recurrent.size());
    py::dict d;
    d["rope"]      = std::vector<bool>(rope.begin(), rope.end());
    d["swa"]       = std::vector<bool>(swa.begin(), swa.end());
    d["recurrent"] = std::vector<bool>(recurrent.begin(), recurrent.end());
    return d;
}

// the knobs of llama_ext_model_get_refusal by the names the Python package gives them
const std::pair<const char *, llama_ext_knob> KNOBS[] = {
    {"lambda", LLAMA_EXT_KNOB_LAMBDA}, {"ceiling", LLAMA_EXT_KNOB_CEILING},
    {"temperature", LLAMA_EXT_KNOB_TEMPERATURE}, {"top_k", LLAMA_EXT_KNOB_TOP_K}, {"memory", LLAMA_EXT_KNOB_MEMORY},
};

// the library's reason for refusing a knob on a loaded model, or None where it takes it
std::optional<std::string> model_refusal(std::uintptr_t model_address, const std::string & knob) {
    const auto [model, n_layer] = model_from_address(model_address);
    const auto * it = std::find_if(std::begin(KNOBS), std::end(KNOBS), [&](const auto & k) { return knob == k.first; });
    if (it == std::end(KNOBS)) {
        std::string names;
        for (const auto & k : KNOBS) {
            names += std::string(names.empty() ? "" : ", ") + k.first;
        }
        throw py::value_error("knob '" + knob + "': use one of " + names);
    }
    const int32_t n = llama_ext_model_get_refusal(model, it->second, nullptr, 0);
    if (n == LLAMA_EXT_ERR_UNSUPPORTED) {
        throw py::value_error("llama_ext_model_get_refusal: a vocab-only model has no hyperparameters to answer from; "
                              "load the model with no_alloc=True instead (hyperparameters and tensor metadata, no data)");
    }
    check_status(n < 0 ? n : 0, "llama_ext_model_get_refusal");
    if (n == 0) {
        return std::nullopt;
    }
    std::string why(n + 1, '\0');
    llama_ext_model_get_refusal(model, it->second, why.data(), why.size());
    why.resize(n);
    return why;
}

py::dict model_devices(std::uintptr_t model_address) {
    const auto [model, n_layer] = model_from_address(model_address);
    std::vector<const char *> names(n_layer + 1, nullptr);
    check_status(llama_ext_model_get_layer_devices(model, names.data(), names.size()) == n_layer ? 0 : -1,
                 "llama_ext_model_get_layer_devices");
    py::list layers;
    for (int32_t il = 0; il < n_layer; ++il) {
        layers.append(std::string(names[il] ? names[il] : ""));
    }
    py::dict d;
    d["layers"] = layers;
    d["output"] = std::string(names[n_layer] ? names[n_layer] : "");
    return d;
}

void memory_open(std::uintptr_t ctx_address, const std::string & path, const std::string & dir, bool keep, int type,
                 uint64_t capacity, bool reopen, int axes, int landmark) {
    llama_ext_memory_params p{};
    p.axes     = axes;
    p.landmark = landmark;
    p.path     = path.c_str();
    p.dir      = dir.c_str();
    p.keep     = keep ? 1 : 0;
    p.type     = type;
    p.capacity = capacity;
    p.reopen   = reopen ? 1 : 0;
    char err[1024] = {0};
    const int32_t rc = llama_ext_memory_open(mutable_context_from_address(ctx_address), &p, err, sizeof(err));
    if (rc != 0) {
        // the library's reason (a path, an errno message, the value to change) is the message
        throw py::value_error(std::string("document memory: ") + err);
    }
}

void memory_set_hold(std::uintptr_t ctx_address, int mode) {
    char err[1024] = {0};
    const int32_t rc = llama_ext_memory_set_hold(mutable_context_from_address(ctx_address), mode, err, sizeof(err));
    if (rc != 0) {
        throw py::value_error(std::string("document memory: ") + err);
    }
}

void memory_set_question(std::uintptr_t ctx_address, uint32_t candidates, uint32_t select_tokens) {
    char err[1024] = {0};
    const int32_t rc = llama_ext_memory_set_question(mutable_context_from_address(ctx_address), candidates,
                                                     select_tokens, err, sizeof(err));
    if (rc != 0) {
        throw py::value_error(std::string("document memory: ") + err);
    }
}

py::dict memory_info(std::uintptr_t ctx_address) {
    llama_ext_memory_info info{};
    check_status(llama_ext_memory_get_info(context_from_address(ctx_address), &info), "llama_ext_memory_get_info");
    py::dict d;
    d["n_tokens"]      = info.n_tokens;
    d["n_blocks"]      = info.n_blocks;
    d["n_blocks_cap"]  = info.n_blocks_cap;
    d["bytes_on_disk"] = info.bytes_on_disk;
    d["bytes_in_ram"]  = info.bytes_in_ram;
    d["n_block"]       = info.n_block;
    d["n_select"]      = info.n_select;
    d["layer_first"]   = info.layer_first;
    d["n_kv"]          = info.n_kv;
    d["head_dim"]      = info.head_dim;
    d["type"]          = info.type;
    d["n_candidates"]    = info.n_candidates;
    d["n_select_tokens"] = info.n_select_tokens;
    d["n_landmark"]      = info.n_landmark;
    return d;
}

py::array_t<int32_t> memory_selection(std::uintptr_t ctx_address, int32_t il) {
    llama_ext_memory_info info{};
    check_status(llama_ext_memory_get_info(context_from_address(ctx_address), &info), "llama_ext_memory_get_info");
    py::array_t<int32_t> out({(py::ssize_t) info.n_kv, (py::ssize_t) info.n_select});
    check_status(llama_ext_memory_get_selection(context_from_address(ctx_address), il, out.mutable_data(),
                                                (size_t) out.size()), "llama_ext_memory_get_selection");
    return out;
}

py::tuple memory_axes(std::uintptr_t ctx_address, int32_t il) {
    llama_ext_memory_info info{};
    check_status(llama_ext_memory_get_info(context_from_address(ctx_address), &info), "llama_ext_memory_get_info");
    py::array_t<float> axes({(py::ssize_t) info.n_kv, (py::ssize_t) info.head_dim, (py::ssize_t) info.head_dim});
    const int32_t rc = llama_ext_memory_get_axes(context_from_address(ctx_address), il, axes.mutable_data(),
                                                 (size_t) axes.size());
    if (rc < 0) {
        check_status(rc, "llama_ext_memory_get_axes");
    }
    return py::make_tuple(axes, rc == 1);
}

py::tuple memory_read_block(std::uintptr_t ctx_address, uint32_t ib, int32_t il, uint32_t g) {
    llama_ext_memory_info info{};
    check_status(llama_ext_memory_get_info(context_from_address(ctx_address), &info), "llama_ext_memory_get_info");
    py::array_t<float> k({(py::ssize_t) info.n_block, (py::ssize_t) info.head_dim});
    py::array_t<float> v({(py::ssize_t) info.n_block, (py::ssize_t) info.head_dim});
    check_status(llama_ext_memory_read_block(context_from_address(ctx_address), ib, il, g, k.mutable_data(),
                                             v.mutable_data()), "llama_ext_memory_read_block");
    return py::make_tuple(k, v);
}

void set_top_k(std::uintptr_t ctx_address, uint32_t k, uint32_t layer, uint32_t distance) {
    check_status(llama_ext_set_top_k(mutable_context_from_address(ctx_address), k, layer, distance),
                 "llama_ext_set_top_k");
}

py::tuple get_top_k(std::uintptr_t ctx_address) {
    uint32_t k = 0, layer = 0, distance = 0;
    check_status(llama_ext_get_top_k(context_from_address(ctx_address), &k, &layer, &distance), "llama_ext_get_top_k");
    return py::make_tuple(k, layer, distance);
}

void set_temperature(std::uintptr_t ctx_address,
                     py::array_t<float, py::array::c_style | py::array::forcecast> tau,
                     uint32_t log_length) {
    llama_context * ctx = mutable_context_from_address(ctx_address);
    check_status(llama_ext_set_temperature(ctx, tau.data(), (size_t) tau.size(), log_length),
                 "llama_ext_set_temperature");
}

py::tuple get_temperature(std::uintptr_t ctx_address) {
    const llama_context * ctx = context_from_address(ctx_address);
    llama_ext_context_info info{};
    check_status(llama_ext_context_get_info(ctx, &info), "llama_ext_context_get_info");
    py::array_t<float> tau({(py::ssize_t) info.n_layer, (py::ssize_t) info.n_head});
    uint32_t log_length = 0;
    check_status(llama_ext_get_temperature(ctx, tau.mutable_data(), (size_t) tau.size(), &log_length),
                 "llama_ext_get_temperature");
    return py::make_tuple(tau, log_length);
}

void set_temperature_points(std::uintptr_t ctx_address,
                            py::array_t<uint32_t, py::array::c_style | py::array::forcecast> lengths,
                            py::array_t<float, py::array::c_style | py::array::forcecast> tau) {
    const size_t n_points = (size_t) lengths.size();
    if (n_points > 0 && (size_t) tau.size() % n_points != 0) {
        throw py::value_error("tau must hold the same number of values for every point");
    }
    const size_t n_per_point = n_points > 0 ? (size_t) tau.size() / n_points : 0;
    check_status(llama_ext_set_temperature_points(mutable_context_from_address(ctx_address), lengths.data(), tau.data(),
                                                  n_points, n_per_point),
                 "llama_ext_set_temperature_points");
}

py::tuple get_temperature_points(std::uintptr_t ctx_address) {
    const llama_context * ctx = context_from_address(ctx_address);
    llama_ext_context_info info{};
    check_status(llama_ext_context_get_info(ctx, &info), "llama_ext_context_get_info");
    const int32_t n_points = llama_ext_get_temperature_n_points(ctx);
    check_status(n_points < 0 ? n_points : 0, "llama_ext_get_temperature_n_points");
    py::array_t<uint32_t> lengths(n_points);
    py::array_t<float> tau({(py::ssize_t) n_points, (py::ssize_t) info.n_layer, (py::ssize_t) info.n_head});
    check_status(llama_ext_get_temperature_points(ctx, lengths.mutable_data(), tau.mutable_data(), (size_t) n_points),
                 "llama_ext_get_temperature_points");
    return py::make_tuple(lengths, tau);
}

void stats_enable(std::uintptr_t ctx_address, bool on) {
    check_status(llama_ext_stats_enable(mutable_context_from_address(ctx_address), on), "llama_ext_stats_enable");
}

void stats_set_reduce(std::uintptr_t ctx_address, int reduce) {
    check_status(llama_ext_stats_set_reduce(mutable_context_from_address(ctx_address),
                                            static_cast<llama_ext_stats_reduce>(reduce)), "llama_ext_stats_set_reduce");
}

// 1 where ggml ops in the graph reduce the layer's statistics, 0 where the CPU op does
py::array_t<uint8_t> stats_layer_reduce(std::uintptr_t ctx_address) {
    const llama_context * ctx = context_from_address(ctx_address);
    llama_ext_context_info info{};
    check_status(llama_ext_context_get_info(ctx, &info), "llama_ext_context_get_info");
    py::array_t<uint8_t> graph((py::ssize_t) info.n_layer);
    check_status(llama_ext_stats_get_layer_reduce(ctx, graph.mutable_data(), (size_t) graph.size()) ==
                 (int32_t) info.n_layer ? 0 : -1, "llama_ext_stats_get_layer_reduce");
    return graph;
}

void stats_reset(std::uintptr_t ctx_address) {
    check_status(llama_ext_stats_reset(mutable_context_from_address(ctx_address)), "llama_ext_stats_reset");
}

py::array_t<int64_t> stats_bin_lower() {
    py::array_t<int64_t> lower(llama_ext_stats_n_bins());
    check_status(llama_ext_stats_bin_lower(lower.mutable_data(), (size_t) lower.size()), "llama_ext_stats_bin_lower");
    return lower;
}

// every sum as a float64 array: fields [n_layer, n_head], mass [n_layer, n_head, n_bins]
py::dict stats_read(std::uintptr_t ctx_address) {
    const llama_context * ctx = context_from_address(ctx_address);
    llama_ext_context_info info{};
    check_status(llama_ext_context_get_info(ctx, &info), "llama_ext_context_get_info");

    const py::ssize_t n_layer = info.n_layer;
    const py::ssize_t n_head  = info.n_head;

    const std::pair<const char *, llama_ext_stats_field> fields[] = {
        {"count",      LLAMA_EXT_STATS_COUNT},
        {"pmax",       LLAMA_EXT_STATS_PMAX},
        {"entropy",    LLAMA_EXT_STATS_ENTROPY},
        {"n_keys",     LLAMA_EXT_STATS_N_KEYS},
        {"logit_mean", LLAMA_EXT_STATS_LOGIT_MEAN},
        {"logit_var",  LLAMA_EXT_STATS_LOGIT_VAR},
    };

    py::dict d;
    for (const auto & [name, field] : fields) {
        py::array_t<double> a({n_layer, n_head});
        check_status(llama_ext_stats_get(ctx, field, a.mutable_data(), (size_t) a.size()), "llama_ext_stats_get");
        d[name] = a;
    }

    py::array_t<double> mass({n_layer, n_head, (py::ssize_t) llama_ext_stats_n_bins()});
    check_status(llama_ext_stats_get_mass(ctx, mass.mutable_data(), (size_t) mass.size()), "llama_ext_stats_get_mass");
    d["mass"] = mass;

    return d;
}

py::list backend_devices() {
    // the devices ggml registered in this process (the CPU, and a GPU backend's devices where the library was
    // built with one and the device is visible), in ggml's order: the order llama.cpp offloads layers in
    py::list out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const char * type = "unknown";
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU:   type = "cpu";   break;
            case GGML_BACKEND_DEVICE_TYPE_GPU:   type = "gpu";   break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU:  type = "igpu";  break;
            case GGML_BACKEND_DEVICE_TYPE_ACCEL: type = "accel"; break;
            default: break;
        }
        py::dict d;
        d["name"]        = std::string(ggml_backend_dev_name(dev));
        d["description"] = std::string(ggml_backend_dev_description(dev));
        d["type"]        = type;
        d["backend"]     = std::string(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)));
        out.append(d);
    }
    return out;
}

// llama.cpp's RPC backend (ggml-rpc), reached through its registry entry so that a library built without it still
// loads; its functions are looked up by name, as llama.cpp's --rpc does
ggml_backend_reg_t rpc_registry() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (reg == nullptr) {
        throw std::runtime_error("the library was built without ggml's RPC backend: reinstall with "
                                 "CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install . (the default build has it)");
    }
    return reg;
}

// the connections to RPC servers this process lost (patch 0016): how many, and the last one's message naming the server
std::pair<size_t, std::string> rpc_failure() {
    using failure_t = size_t (*)(char *, size_t);
    auto failure = reinterpret_cast<failure_t>(
        ggml_backend_reg_get_proc_address(rpc_registry(), "ggml_backend_rpc_failure"));
    if (failure == nullptr) {
        throw std::runtime_error("ggml's RPC backend has no ggml_backend_rpc_failure (patch 0016)");
    }
    char message[512];
    size_t count = failure(message, sizeof(message));
    return {count, std::string(message)};
}

// registers the devices of one rpc-server (endpoint "host:port"), once per endpoint, and returns their names;
// the caller has checked that the server answers: ggml-rpc aborts the process when it cannot connect
std::vector<std::string> rpc_add_server(const std::string & endpoint) {
    using add_server_t = ggml_backend_reg_t (*)(const char *);
    auto add_server = reinterpret_cast<add_server_t>(
        ggml_backend_reg_get_proc_address(rpc_registry(), "ggml_backend_rpc_add_server"));
    if (add_server == nullptr) {
        throw std::runtime_error("ggml's RPC backend has no ggml_backend_rpc_add_server");
    }
    const size_t failures_before = rpc_failure().first;
    ggml_backend_reg_t reg = nullptr;
    {
        py::gil_scoped_release release;
        reg = add_server(endpoint.c_str());
    }
    if (reg == nullptr) {
        auto failure = rpc_failure();
        if (failure.first > failures_before) {
            throw std::runtime_error(failure.second);
        }
        throw std::runtime_error("the RPC server at " + endpoint + " offers no device");
    }
    bool registered = false;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        registered = registered || ggml_backend_reg_get(i) == reg;
    }
    if (!registered) {
        ggml_backend_register(reg);
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        names.push_back(ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)));
    }
    return names;
}

// serves this process's CPU device to RPC clients at endpoint until the process ends (ggml-rpc's server loop: one
// client at a time); returns only when the server cannot start
void rpc_serve(const std::string & endpoint, size_t n_threads, const std::string & cache_dir) {
    using start_server_t = void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
    auto start_server = reinterpret_cast<start_server_t>(
        ggml_backend_reg_get_proc_address(rpc_registry(), "ggml_backend_rpc_start_server"));
    if (start_server == nullptr) {
        throw std::runtime_error("ggml's RPC backend has no ggml_backend_rpc_start_server");
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        throw std::runtime_error("no CPU device to serve");
    }
    py::gil_scoped_release release;
    start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(), n_threads, 1, &cpu);
}

} // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "Binding of the llama-extrapolate C API in the patched libllama";

    m.attr("COMPILED_API_VERSION") = LLAMA_EXT_API_VERSION;

    m.def("api_version", &llama_ext_api_version, "API version of the loaded patched libllama");
    m.def("version", [] { return std::string(llama_ext_version()); },
          "llama-extrapolate version the library was built for");
    m.def("upstream_commit", [] { return std::string(llama_ext_upstream_commit()); },
          "upstream llama.cpp commit the patches apply to");
    m.def("patches", [] { return split_list(llama_ext_patches()); }, "applied patches, in order");
    m.def("features", [] { return split_list(llama_ext_features()); }, "attention features compiled in");
    m.def("library_path", &library_path, "file of the libllama this module is bound to");
    m.def("backends", [] {
              std::vector<std::string> out;
              for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
                  out.push_back(ggml_backend_reg_name(ggml_backend_reg_get(i)));
              }
              return out;
          }, "the ggml backends the library was built with (e.g. CPU, Vulkan), whether a device is visible or not");
    m.def("backend_devices", &backend_devices,
          "the devices ggml offers in this process: [{name, description, type, backend}], in offload order");
    m.def("rpc_add_server", &rpc_add_server, py::arg("endpoint"),
          "register the devices of the rpc-server at endpoint (host:port) for the models loaded after; their names");
    m.def("rpc_protocol", [] {
              return std::make_tuple(RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION, RPC_PROTO_PATCH_VERSION);
          }, "the ggml RPC protocol version (major, minor, patch) this library speaks");
    m.def("rpc_failure", &rpc_failure,
          "(count, message): the connections to RPC servers this process lost, the last one's message naming it");
    m.def("rpc_serve", &rpc_serve, py::arg("endpoint"), py::arg("n_threads"), py::arg("cache_dir") = "",
          "serve this process's CPU to RPC clients at endpoint (host:port); returns only if the server cannot start");
    m.def("api_address", [] { return reinterpret_cast<std::uintptr_t>(&llama_ext_api_version); },
          "address of llama_ext_api_version in this process (to check that two bindings share one library)");
    m.def("context_info", &context_info, py::arg("ctx_address"),
          "facts of a live llama_context given its address (e.g. from llama_cpp.Llama)");
    m.def("model_devices", &model_devices, py::arg("model_address"),
          "{layers: [device name per layer], output: device name} of a loaded llama_model");
    m.def("model_layers", &model_layers, py::arg("model_address"),
          "per layer: does it rotate q and k (RoPE), is it a sliding-window layer, a recurrent one");
    m.def("model_refusal", &model_refusal, py::arg("model_address"), py::arg("knob"),
          "why the library refuses a knob (lambda, ceiling, temperature, top_k, memory) on a loaded model, or None");
    m.def("model_attention", &model_attention, py::arg("model_address"),
          "Lambda-attention and temperature parameters a model was loaded with");
    m.def("set_temperature", &set_temperature, py::arg("ctx_address"), py::arg("tau"), py::arg("log_length"),
          "softmax temperature: 1, n_layer or n_layer*n_head values (layer-major); log_length 0 = no schedule");
    m.def("seq_pos_offset", [](std::uintptr_t ctx_address, llama_seq_id seq_id) {
              return llama_ext_seq_pos_offset(context_from_address(ctx_address), seq_id);
          }, py::arg("ctx_address"), py::arg("seq_id") = 0,
          "caller position - memory position of a sequence (position re-basing)");
    m.def("get_temperature", &get_temperature, py::arg("ctx_address"),
          "(tau[n_layer, n_head], log_length) of a live context");
    m.def("set_temperature_points", &set_temperature_points, py::arg("ctx_address"), py::arg("lengths"), py::arg("tau"),
          "temperature schedule by points: lengths [n], tau [n] or [n, n_layer] or [n, n_layer, n_head]; n = 0 removes it");
    m.def("get_temperature_points", &get_temperature_points, py::arg("ctx_address"),
          "(lengths[n], tau[n, n_layer, n_head]) of the temperature schedule by points");
    m.def("set_top_k", &set_top_k, py::arg("ctx_address"), py::arg("k"), py::arg("layer"), py::arg("distance"),
          "top-k middle keys from the next decode on (k = 0: off, distance 0: the default); needs a model loaded "
          "with attention.lambda.top_k > 0");
    m.def("memory_open", &memory_open, py::arg("ctx_address"), py::arg("path"), py::arg("dir"), py::arg("keep"),
          py::arg("type"), py::arg("capacity"), py::arg("reopen") = false, py::arg("axes") = 0,
          py::arg("landmark") = 0,
          "open the document memory's store before the first decode (reopen: a kept file as an earlier context left "
          "it, for a state that references its blocks; axes: 0 the block summaries along the key channels, 1 along "
          "the principal axes of the document's first keys; landmark: tokens per landmark, whose q.k ranks the "
          "blocks instead of the bound, 0 none)");
    m.def("memory_axes", &memory_axes, py::arg("ctx_address"), py::arg("layer"),
          "([n_kv, head_dim, head_dim] axes of the layer's block summaries, one a row; whether they are the "
          "principal axes of the document's first keys)");
    m.def("memory_info", &memory_info, py::arg("ctx_address"), "tokens, blocks and bytes of the document memory");
    m.def("memory_set_hold", &memory_set_hold, py::arg("ctx_address"), py::arg("mode"),
          "what the next decodes do with their blocks: 0 select, 1 select and keep them in RAM, 2 hold the kept ones");
    m.def("memory_set_question", &memory_set_question, py::arg("ctx_address"), py::arg("candidates"),
          py::arg("select_tokens"), "how the next selecting decodes select: candidates reranked (0: the bound "
          "alone) and the last tokens whose queries select (0: all)");
    m.def("memory_selection", &memory_selection, py::arg("ctx_address"), py::arg("layer"),
          "[n_kv, m] blocks each KV head of the layer selected in the last decode");
    m.def("memory_read_block", &memory_read_block, py::arg("ctx_address"), py::arg("block"), py::arg("layer"),
          py::arg("kv_head"), "(keys, values) [B, head_dim] of a stored block, as stored");
    m.def("memory_last_error", [](std::uintptr_t ctx_address) {
        return std::string(llama_ext_memory_last_error(context_from_address(ctx_address)));
    }, py::arg("ctx_address"), "why the document memory failed in the last decode");
    m.def("get_top_k", &get_top_k, py::arg("ctx_address"), "(k, layer, distance) in use, distance resolved");
    m.def("stats_enable", &stats_enable, py::arg("ctx_address"), py::arg("on"),
          "collect attention statistics while decoding (non-flash attention, one KV stream)");
    m.def("stats_enabled", [](std::uintptr_t ctx_address) {
              return llama_ext_stats_enabled(context_from_address(ctx_address));
          }, py::arg("ctx_address"), "whether attention statistics are being collected");
    m.def("stats_reset", &stats_reset, py::arg("ctx_address"), "set the attention statistics to zero");
    m.def("stats_set_reduce", &stats_set_reduce, py::arg("ctx_address"), py::arg("reduce"),
          "where the statistics are reduced: 0 auto, 1 the CPU op on every layer, 2 ggml ops on every layer");
    m.def("stats_layer_reduce", &stats_layer_reduce, py::arg("ctx_address"),
          "[n_layer] 1 where ggml ops in the graph reduce the layer's statistics, 0 where the CPU op does");
    m.def("stats_bin_lower", &stats_bin_lower, "smallest query-key distance of each distance bin");
    m.def("stats_read", &stats_read, py::arg("ctx_address"),
          "sums of the attention statistics: count, pmax, entropy, n_keys, logit_mean, logit_var "
          "[n_layer, n_head] and mass [n_layer, n_head, n_bins]");
}
