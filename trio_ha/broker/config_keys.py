"""Which ``broker.conf`` keys a broker takes, which of RocketMQ's it ignores, which it refuses.

An operator's ``broker.conf`` is RocketMQ's. Every key in it is one of three kinds:

* a key this project reads (a ``BrokerConfig`` or ``StoreConfig`` field under RocketMQ's
  name): it is parsed and range-checked;
* another RocketMQ 4.9.8 key (``ROCKETMQ_KEYS``: the fields of its BrokerConfig,
  MessageStoreConfig, NettyServerConfig and NettyClientConfig): thread-pool sizes, buffer
  sizes and the like, which tune machinery this broker does not have. They are accepted
  and named in one warning line, so a stock file starts;
* anything else: an error naming the key and the closest known one, so ``lisenPort`` or
  ``brokerRol`` is a typo caught at start, not a default silently used.

Keys that switch on a feature this broker does not have (``UNSUPPORTED``: DLedger, SQL92
filtering, LMQ, ...) are an error when they are on: the broker would otherwise run without
what the operator asked for (a DLedger group as a plain ASYNC_MASTER).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..config import check_keys as check_known_keys

__all__ = ["ROCKETMQ_KEYS", "UNSUPPORTED", "check_keys"]

_ROCKETMQ_KEY_LIST = """
    accessMessageInMemoryMaxRatio aclEnable adminBrokerThreadPoolNums
    autoCreateSubscriptionGroup autoCreateTopicEnable autoDeleteUnusedStats
    bitMapLengthConsumeQueueExt brokerClusterName brokerFastFailureEnable brokerIP1 brokerIP2
    brokerId brokerName brokerPermission brokerRole brokerTopicEnable channelNotActiveInterval
    checkCRCOnRecover cleanFileForciblyEnable cleanResourceInterval clientAsyncSemaphoreValue
    clientCallbackExecutorThreads clientChannelMaxIdleTimeSeconds clientCloseSocketIfTimeout
    clientManageThreadPoolNums clientManagerThreadPoolQueueCapacity clientOnewaySemaphoreValue
    clientPooledByteBufAllocatorEnable clientSocketRcvBufSize clientSocketSndBufSize
    clientWorkerThreads clusterTopicEnable commercialBaseCount commercialBigCount
    commercialEnable commercialTimerCount commercialTransCount commitCommitLogLeastPages
    commitCommitLogThoroughInterval commitIntervalCommitLog compressedRegister configBlackList
    connectTimeoutMillis consumerFallbehindThreshold consumerManageThreadPoolNums
    consumerManagerThreadPoolQueueCapacity dLegerGroup dLegerPeers dLegerSelfId debugLockEnable
    defaultQueryMaxNum defaultTopicQueueNums deleteCommitLogFilesInterval
    deleteConsumeQueueFilesInterval deleteWhen destroyMapedFileIntervalForcibly
    disableConsumeIfConsumerReadSlowly diskFallRecorded diskMaxUsedSpaceRatio duplicationEnable
    enableCalcFilterBitMap enableConsumeQueueExt enableDLegerCommitLog enableDetailStat
    enableLmq enableMultiDispatch enablePropertyFilter enableScheduleAsyncDeliver
    enableScheduleMessageStats endTransactionPoolQueueCapacity endTransactionThreadPoolNums
    expectConsumerNumUseFilter fastFailIfNoBufferInStorePool fetchNamesrvAddrByAddressServer
    fileReservedTime filterDataCleanTimeSpan filterServerNums filterSupportRetry
    flushCommitLogLeastPages flushCommitLogThoroughInterval flushCommitLogTimed
    flushConsumeQueueLeastPages flushConsumeQueueThoroughInterval
    flushConsumerOffsetHistoryInterval flushConsumerOffsetInterval flushDelayOffsetInterval
    flushDiskType flushIntervalCommitLog flushIntervalConsumeQueue
    flushLeastPagesWhenWarmMapedFile forceRegister haHousekeepingInterval haListenPort
    haMasterAddress haSendHeartbeatInterval haSlaveFallbehindMax haTransferBatchSize
    heartbeatThreadPoolNums heartbeatThreadPoolQueueCapacity highSpeedMode isEnableBatchPush
    isolateLogEnable listenPort longPollingEnable mappedFileSizeCommitLog
    mappedFileSizeConsumeQueue mappedFileSizeConsumeQueueExt maxDelayTime
    maxErrorRateOfBloomFilter maxHashSlotNum maxIndexNum maxLmqConsumeQueueNum maxMessageSize
    maxMsgsNumBatch maxTransferBytesOnMessageInDisk maxTransferBytesOnMessageInMemory
    maxTransferCountOnMessageInDisk maxTransferCountOnMessageInMemory messageDelayLevel
    messageIndexEnable messageIndexSafe messageStorePlugIn msgTraceTopicName namesrvAddr
    notifyConsumerIdsChangedEnable offsetCheckInSlave osPageCacheBusyTimeOutMills
    preferredLeaderId processReplyMessageThreadPoolNums pullMessageThreadPoolNums
    pullThreadPoolQueueCapacity putMessageFutureThreadPoolNums putMsgIndexHightWater
    putThreadPoolQueueCapacity queryMessageThreadPoolNums queryThreadPoolQueueCapacity
    readOnlyCommitLogStorePaths redeleteHangedFileInterval regionId registerBrokerTimeoutMills
    registerNameServerPeriod rejectTransactionMessage replyThreadPoolQueueCapacity rocketmqHome
    scheduleAsyncDeliverMaxPendingLimit scheduleAsyncDeliverMaxResendNum2Blocked
    sendMessageThreadPoolNums sendThreadPoolQueueCapacity serverAsyncSemaphoreValue
    serverCallbackExecutorThreads serverChannelMaxIdleTimeSeconds serverOnewaySemaphoreValue
    serverPooledByteBufAllocatorEnable serverSelectorThreads serverSocketBacklog
    serverSocketRcvBufSize serverSocketSndBufSize serverWorkerThreads shortPollingTimeMills
    slaveReadEnable slaveTimeout startAcceptSendRequestTimeStamp storePathCommitLog
    storePathDLedgerCommitLog storePathRootDir storeReplyMessageEnable syncFlushTimeout traceOn
    traceTopicEnable transactionCheckInterval transactionCheckMax transactionTimeOut
    transferMsgByHeap transientStorePoolEnable transientStorePoolSize useEpollNativeSelector
    useReentrantLockWhenPutMessage useTLS waitTimeMillsInHeartbeatQueue
    waitTimeMillsInPullQueue waitTimeMillsInSendQueue waitTimeMillsInTransactionQueue
    warmMapedFileEnable writeBufferHighWaterMark writeBufferLowWaterMark
"""
#: the keys of RocketMQ 4.9.8's broker configuration classes
ROCKETMQ_KEYS = frozenset(_ROCKETMQ_KEY_LIST.split())

#: keys that switch on what this broker does not do: refused when "true"
UNSUPPORTED = {
    "enableDLegerCommitLog": "DLedger (Raft) commitlog replication is not supported; use "
                             "brokerRole SYNC_MASTER/ASYNC_MASTER/SLAVE",
    "enablePropertyFilter": "SQL92 property filtering is not supported; consumers filter by tag",
    "enableCalcFilterBitMap": "SQL92 property filtering is not supported",
    "enableLmq": "light message queues (LMQ) are not supported",
    "enableMultiDispatch": "multi-dispatch (LMQ) is not supported",
    "duplicationEnable": "commitlog duplication (duplicationEnable) is not supported",
    "enableConsumeQueueExt": "the consume-queue extension file is not supported",
}


def check_keys(properties: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """Check a broker.conf's keys (see the module's docstring): raises ConfigError for an
    unknown key or an unsupported feature switched on; returns the RocketMQ keys that are
    accepted and ignored, sorted."""
    return check_known_keys(properties, known, accepted=ROCKETMQ_KEYS, unsupported=UNSUPPORTED)
