"""The Chinese of ``tutorial_lib.causes``: every known cause's name and fix, and every fix the doctor writes when no
known message matched (signals, exit codes, hangs), for the Chinese edition (``tl.set_language("zh")``).

Keyed by the English: ``CAUSES_ZH`` by ``Cause.name``, ``FIXES_ZH`` by the name of the English constant in
``causes`` (a template keeps the English one's fields), ``SIGNAL_FIXES_ZH`` by signal name. API, flag, file and
variable names stay as they are; notebook references name the notebook and section number ("见 07 第 2 节"), as the
Chinese notebooks do (their section titles differ). tests/unit/test_i18n.py fails when a cause, fix or signal has no
Chinese, or a Chinese text drops a name, a field or a notebook reference of its English.
"""

from __future__ import annotations

import re

from . import causes
from .causes import FINISHED_CAUSE, INTERRUPTED_CAUSE, REFUSED_CAUSE, STOPPED_CAUSE, SYNTAX_CAUSE, signal_name

# Cause.name -> (Chinese name, Chinese fix), in the order of CAUSES.
CAUSES_ZH: dict[str, tuple[str, str]] = {
    "port in use": (
        "端口被占用",
        "另一个进程占用了 master_port：保持 master_port=None（启动器会挑选一个空闲端口），或换一个端口（见 06 第 5 节）"),
    "rendezvous timeout": (
        "rendezvous（汇合）超时",
        "并非所有节点都按时加入：在每个节点上用相同的 --nnodes 和 rendezvous endpoint 启动 torchrun，并检查该端口可以访问"
        "（见 06 第 4 节）"),
    "out of memory": (
        "显存或内存不足（OOM）",
        "这次分配放不下：减小每个 rank 的 batch 并配合梯度累积（见 02 第 3 节），或使用激活检查点（activation checkpointing）"
        "或 FSDP 分片（见 04 的 OOM 阶梯）（见 07 第 4 节）"),
    "checkpoint does not match the model": (
        "检查点与模型不匹配",
        "该检查点保存自另一种形状的模型：用保存时的参数构建模型（相同的层数和宽度：保存那次运行的 command.txt 里有这些参数；"
        "步文件夹中的 checkpoint.json 只记录步数、world size、格式和策略），或不带 --resume 从头开始（见 05 第 3 节）"),
    "collective mismatch": (
        "集合通信不匹配（collective mismatch）",
        "各 rank 调用了不同的集合通信（某个 rank 跳过或调换了一次调用）：每个 rank 必须以相同的顺序发起相同的集合通信；"
        "TORCH_DISTRIBUTED_DEBUG=DETAIL 会给出每个 rank 的调用（见 07 第 1 节）"),
    "abort at interpreter exit": (
        "解释器退出时中止",
        "脚本已经返回：是 gloo 在 Python 退出清理期间中止了进程，不是你的代码，该 rank 的工作已经完成；在 main() 末尾的 "
        "finally 中调用 dist.destroy_process_group()（这让中止更少见，但不能杜绝），不要用 os._exit，它会跳过 atexit "
        "处理函数和正在进行的 dcp.async_save；启动器的 rank runner 会替你用 os._exit 退出（见 07 第 2 节）"),
    "DDP + torch.compile bucket split": (
        "DDP + torch.compile 的梯度桶（bucket）切分",
        "在 DDP 下使用 torch.compile 且 bucket_cap_mb 较小：dynamo 的 DDPOptimizer 无法按这些梯度桶切分计算图。编译前设置 "
        "torch._dynamo.config.optimize_ddp = False（train_lm.py --no-optimize-ddp：一张计算图，DDP 的梯度桶仍与反向重叠），"
        "或使用更大的 bucket_cap_mb（见 11 第 9 节）"),
    "DDP unused parameters": (
        "DDP 有未使用的参数",
        "有参数没有得到梯度：让损失（loss）用到每个模块，或使用 DDP(find_unused_parameters=True)（见 01 第 6 节）"),
    "no GPU": (
        "没有 GPU",
        "脚本需要 GPU，而这台机器没有 torch 能用的 GPU（或 torch 是 CPU 版本）：按机器上实际有的选择设备和后端"
        "（device = 'cuda' if torch.cuda.is_available() else 'cpu'；CUDA 上用 nccl，CPU 上用 gloo；torch.cuda.set_device "
        "和 device_ids 只在 CUDA 上使用），课程脚本就是这样做的；或者在 nvidia-smi 能列出 GPU、装有 CUDA 版 torch 的机器上"
        "运行（见 06 第 2 节）"),
    "invalid device ordinal": (
        "无效的设备序号（invalid device ordinal）",
        "某个 rank 请求了本节点没有的 GPU 编号：GPU 要由 LOCAL_RANK 决定（torch.cuda.set_device(int(os.environ['LOCAL_RANK']))），"
        "绝不能用 RANK，它把所有节点的 rank 一起计数；每个节点最多启动 torch.cuda.device_count() 个 rank（--nproc-per-node；"
        "CUDA_VISIBLE_DEVICES 限制节点可见的 GPU）（见 06 第 2 节）"),
    "collective timeout (hang)": (
        "集合通信超时（挂起，hang）",
        "某个 rank 在集合通信中等待一个从未加入的对端：比较各 rank 的最后一步和调用栈，找出停在别处的那个 rank；把 "
        "init_process_group(timeout=...) 设得短一些，让挂起变成报错（见 07 第 1 节；不均匀输入：见 02 第 4 节）"),
    "NCCL error": (
        "NCCL 错误",
        "用 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET 重新运行，并检查 NCCL_SOCKET_IFNAME（见 07 第 3 节）"),
}

# The name of a template in ``causes`` -> its Chinese, with the same {fields}.
FIXES_ZH: dict[str, str] = {
    "EXCEPTION_FIX": "rank {rank} 的 traceback（回溯）就是根因：修复它指向的代码；其他 rank 失败只是因为它们的对端已经不在了"
                     "（见 07 第 2 节）",
    "EVERY_RANK_RAISED_FIX": "rank {ranks} 各自抛出了错误（rank {rank} 最先）：不是某个对端的失败，而是它们每一个都会运行的代码"
                             "出了错；修复 traceback 指向的那一行（见 07 第 2 节）",
    "FINISHED_FIX": "rank {rank} 已返回（退出码 0），而 rank {waiting} 还在一个它从未调用的集合通信中等它：可能是写在 "
                    "`if rank == 0:` 里的集合通信，只在部分 rank 上执行的最后一次 barrier() 或 all_reduce，或者某个 rank "
                    "的批次比其他 rank 多。每个 rank 必须以相同的顺序调用相同的集合通信（见 07 第 1c 节；不均匀输入："
                    "见 02 第 4 节）",
    "EXIT_FIX": "rank {rank} 以退出码 {code} 自行结束，没有留下 traceback：它的脚本或它调用的库中有 sys.exit({code})、"
                "exit({code}) 或 os._exit({code})（{meaning}）；在代码中搜索 sys.exit、exit( 和 os._exit，改为在那里抛出"
                "异常，这样 @record 会保留 traceback（见 07 第 2 节）",
    "P2P_HINT": "；一台机器上有多块消费级 GPU（没有 NVLink，例如 RTX 4090）时，坏掉的点对点（P2P）通路也会让 NCCL 的集合通信"
                "这样挂起：用 env={\"NCCL_P2P_DISABLE\": \"1\"} 重新运行（run_script / LaunchSpec 的 env=）；"
                "`python -m tutorial_lib env` 会列出不能互相访问的 GPU 对",
    "NO_ERROR_FIX": "该 rank 没有留下 traceback，torchrun 也没有报告它的退出码，而它的对端失去了连接：最可能是被信号杀死"
                    "（OOM killer 或 kill -9 发出的 SIGKILL）；它日志的最后几行说明了它当时在做什么（见 07 第 4 节）",
    "HANG_FIX": "没有 rank 在时限内结束：调用栈显示了每个 rank 在哪里等待；不在集合通信中的那个 rank 就是元凶；设置 "
                "init_process_group(timeout=...)，让挂起变成报错（见 07 第 1 节）",
    "INTERRUPTED_FIX": "无需修复：是你停止了它（终端中的 Ctrl-C 或 Jupyter 内核中断），启动器已停止 torchrun 和所有 rank；"
                       "用 command.txt 重新运行，或从它最后一个检查点恢复训练（见 05 第 4 节）；如果你是因为它挂起（hang）"
                       "才停止它，调用栈显示了每个 rank 当时所在的位置（见 07 第 1 节）",
    "STOPPED_FIX": "没有 rank 失败：启动它的进程在等待时抛出了 {error}，启动器已停止 torchrun 和所有 rank；修复这个错误后"
                   "用 command.txt 重新运行（见 07 第 6 节）",
    "REFUSED_FIX": "什么也没有运行，所以 output.log 是空的，也没有 logs/：按 sbatch 的消息修改这次启动的 SlurmSpec（任何节点都"
                   "没有的 --cpus-per-task、--mem 或 --gres，sbatch_args 中未知的 --partition、--account 或 --qos），然后重新"
                   "启动；`sinfo -N -o '%N %c %m %G'` 列出每个节点拥有的资源",
    "SYNTAX_FIX": "Python 无法解析 {path} 的第 {line} 行：改正这一行（rank 日志中该行下方的 ^ 指向出错的位置），并在启动前用 "
                  "`python -m py_compile {path}` 检查该文件（见 07 第 2 节）",
    "SIGNAL_FIX": "该 rank 被信号终止：阅读 logs/ 中它的日志",
    "UNKNOWN_FIX": "没有匹配的已知模式：阅读运行目录中的 output.log 和 logs/ 下各 rank 的日志",
}

SIGNAL_FIXES_ZH: dict[str, str] = {
    "SIGKILL": "被 SIGKILL 杀死：最可能是 Linux 的 OOM killer（把峰值 RSS 与机器内存比较；dmesg 会显示 'Out of memory: "
               "Killed process'），或是有人手动 kill（见 07 第 4 节）",
    "SIGSEGV": "原生代码（C++/CUDA）中的崩溃：rank 日志中 faulthandler 打印的调用栈给出了调用它的 Python 行（见 07 第 1d 节："
               "在 gloo 上以 TORCH_DISTRIBUTED_DEBUG=DETAIL 运行 DDP 就会这样崩溃）",
    "SIGABRT": "原生代码中止（abort）：常见于 gloo 或 NCCL 因集合通信出错而中止，或一个 C++ 异常；阅读 logs/ 中该 rank 的 "
               "stderr（见 07 第 1 节）",
    "SIGTERM": "被外部停止（一个 rank 失败时 torchrun 会停止其他 rank；超时或中断时由启动器停止）：找出最先失败的那个 rank",
    "SIGFPE": "没有 traceback：原生代码中的算术错误，最常见的是 C/C++ 代码（扩展、自定义算子）中的整数除以零；Python 和 torch "
              "则会抛出 ZeroDivisionError 或得到 inf/nan。rank 日志中 faulthandler 打印的调用栈给出了调用它的 Python 行"
              "（见 07 第 2 节）",
    "SIGBUS": "没有 traceback：原生代码中的错误内存访问，典型情况是内存映射的文件（数据集、检查点）在使用中被截断或删除，或 "
              "/dev/shm 已满（DataLoader 的 worker 进程通过它传递张量：df -h /dev/shm；在 Docker 中调大 --shm-size）"
              "（见 07 第 2 节）",
    "SIGILL": "没有 traceback：CPU 遇到了它不支持的指令：某个二进制文件（torch、numpy、扩展）是为比本机更新的 CPU（AVX-512 等）"
              "编译的，或者安装已损坏；为本机重新安装这些 wheel（见 07 第 2 节）",
    "SIGTRAP": "没有 traceback：C/C++ 代码中的原生断点或断言陷阱（__builtin_trap），或有调试器附加在该 rank 上；rank 日志中 "
               "faulthandler 打印的调用栈给出了 Python 行（见 07 第 2 节）",
    "SIGSYS": "没有 traceback：一个被沙箱禁止的系统调用（容器中的 seccomp）；用容器的默认配置运行，或放行该调用（见 07 第 2 节）",
    "SIGXCPU": "没有 traceback：该 rank 用完了 CPU 时间限制（ulimit -t，或批处理调度器的限制）；提高限制或申请更多时间"
               "（见 07 第 2 节）",
    "SIGXFSZ": "没有 traceback：一次写入超出了文件大小限制（ulimit -f），例如检查点或日志；提高该限制（见 07 第 2 节）",
    "SIGPIPE": "没有 traceback：该 rank 写入的管道或套接字的读取方已经不在了（输出通过管道传给了一个已退出的命令，比如 head）"
               "（见 07 第 2 节）",
    "SIGINT": "被中断（终端中的 Ctrl-C，Jupyter 中的内核中断）：本身并没有出错",
    "SIGHUP": "它的终端或会话已关闭（ssh 会话结束）：用 nohup、tmux 或批处理调度器运行长时间的任务",
}

# The doctor's causes that are not in CAUSES: (pattern of the English, Chinese with the pattern's groups).
_DYNAMIC_CAUSES = (
    (re.compile(r"Python exception \((?P<name>.+)\)"), "Python 异常（{name}）"),
    (re.compile(r"killed by (?P<signal>.+)"), "被 {signal} 终止"),
    (re.compile(r"exited with code (?P<code>-?\d+) without a traceback"), "以退出码 {code} 退出，没有 traceback"),
    (re.compile(re.escape("died without a Python error")), "进程死亡，没有 Python 错误"),
    (re.compile(re.escape("hang (wall-clock timeout)")), "挂起（hang，超过墙钟时间限制 timeout_s）"),
    (re.compile(re.escape("hang (no progress)")), "挂起（hang，没有进展，stall_timeout_s）"),
    (re.compile(re.escape(FINISHED_CAUSE)), "一个 rank 已结束，其他 rank 还在等它"),
    (re.compile(re.escape(INTERRUPTED_CAUSE)), "被中断"),
    (re.compile(re.escape(STOPPED_CAUSE)), "被启动它的进程停止"),
    (re.compile(re.escape(SYNTAX_CAUSE)), "语法错误（SyntaxError）"),
    (re.compile(re.escape(REFUSED_CAUSE)), "sbatch 拒绝了这个作业"),
    (re.compile("unknown"), "未知"),
    (re.compile("none"), "无"),
)


def cause_name_zh(cause: str) -> str:
    """The Chinese of a ``Diagnosis.cause``: a known cause's (``CAUSES_ZH``) or a fallback's ("Python exception
    (RuntimeError)" -> "Python 异常（RuntimeError）"); ``""`` for a text it does not know.

    Args:
        cause: ``Diagnosis.cause``, as the doctor sets it.
    """
    if cause in CAUSES_ZH:
        return CAUSES_ZH[cause][0]
    for pattern, zh in _DYNAMIC_CAUSES:
        m = pattern.fullmatch(cause)
        if m:
            return zh.format(**m.groupdict())
    return ""


def exit_code_meaning_zh(code: int) -> str:
    """The Chinese of ``causes.exit_code_meaning(code)``.

    Args:
        code: the exit code (1..255) torchrun reported for the rank.
    """
    if code == 1:
        return "1 也是 sys.exit('message') 给出的退出码：此时该消息就是该 rank 的最后一行"
    if code == 2:
        return "2 是 argparse 遇到错误的命令行参数时的退出码：在它的日志中查找 'usage:' 和 'error:'"
    if code in (126, 127):
        return f"{code} 是 shell 的“命令{'不可执行' if code == 126 else '未找到'}”：一个包装脚本"
    if 128 < code < 128 + 65:
        return f"{code} = 128 + {code - 128}：shell 以此表示它的子进程被 {signal_name(128 - code)} 杀死"
    if code == 255:
        return "255 是 sys.exit(-1) 或 os._exit(-1)（退出码按 256 取模）"
    return f"这里没有哪个库会自己以 {code} 退出：它很可能是脚本自己定义的编号"


def fix_texts(name: str, **fields: object) -> tuple[str, str]:
    """``(English, Chinese)`` of the fix template ``name`` of ``causes`` (``"EXCEPTION_FIX"``), formatted with
    ``fields`` (a text without fields is returned as it is); for ``"EXIT_FIX"`` the ``meaning`` field is filled from ``code`` in each language.

    Raises:
        KeyError: ``name`` has no Chinese (a test keeps every template in ``FIXES_ZH``).
    """
    en, zh = getattr(causes, name), FIXES_ZH[name]
    if not fields:  # not a template (P2P_HINT holds braces of its own)
        return en, zh
    if name == "EXIT_FIX":
        code = int(fields["code"])
        return (en.format(meaning=causes.exit_code_meaning(code), **fields),
                zh.format(meaning=exit_code_meaning_zh(code), **fields))
    return en.format(**fields), zh.format(**fields)


def signal_fix_texts(signal: str) -> tuple[str, str]:
    """``(English, Chinese)`` fix for a rank killed by ``signal`` (``"SIGKILL"``); the general one for others."""
    if signal in causes.SIGNAL_FIXES:
        return causes.SIGNAL_FIXES[signal], SIGNAL_FIXES_ZH[signal]
    return fix_texts("SIGNAL_FIX")
